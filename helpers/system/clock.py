"""Clocks across hosts: this process's wall clock as the cluster's records read it, and the
estimate of another host's clock offset from the round trips of control messages.

`now()` is `time.time()`, plus a shift that only tests set: the test hosts (network
namespaces) share one kernel clock, so a test stands in for a host whose clock is off by
setting LABS_CLOCK_SHIFT="worker:0=0.25,ps:1=-0.1" (seconds, by process name); a process
reads its own entry with `use_shift_of(name)`.

`OffsetEstimate` is the NTP client's rule: a ping sent at driver time t1, answered with the
host's time t, received at t2, gives offset t - (t1 + t2)/2 to within half the round trip;
the round trip with the least delay gives the tightest estimate.
"""

from __future__ import annotations

import os
import time

SHIFT_ENV = "LABS_CLOCK_SHIFT"
SHIFT = 0.0  # seconds this process's readings are shifted by (tests only)


def use_shift_of(name: str) -> float:
    """Take this process's clock shift from LABS_CLOCK_SHIFT (its entry `name`, e.g.
    "worker:0"); 0 when it has none. Returns the shift."""
    global SHIFT
    for item in os.environ.get(SHIFT_ENV, "").split(","):
        who, _, seconds = item.partition("=")
        if who.strip() == name and seconds.strip():
            try:
                SHIFT = float(seconds)
            except ValueError:
                raise ValueError(
                    f"{SHIFT_ENV}: {item!r} is not name=seconds (e.g. worker:0=0.25)"
                ) from None
    return SHIFT


def now() -> float:
    """This process's wall clock (s since the epoch), as its events are stamped."""
    return time.time() + SHIFT


class OffsetEstimate:
    """How far one host's clock is ahead of this one's, from ping round trips."""

    def __init__(self):
        self.best: tuple[float, float] | None = None  # (round trip, offset) of the best sample
        self.samples = 0

    def add(self, sent: float, remote: float, received: float) -> None:
        """One round trip: sent and received on this clock, `remote` read on the host's."""
        rtt = received - sent
        if rtt < 0:
            return
        self.samples += 1
        if self.best is None or rtt < self.best[0]:
            self.best = (rtt, remote - (sent + received) / 2)

    @property
    def offset(self) -> float | None:
        """The host's clock minus this one's (s), None before the first sample."""
        return None if self.best is None else self.best[1]

    @property
    def significant(self) -> float:
        """The offset where it is larger than its error, else 0: the same clock (one
        machine, or hosts synchronised better than a round trip) is not shifted by noise."""
        if self.best is None or abs(self.best[1]) <= self.best[0] / 2:
            return 0.0
        return self.best[1]

    @property
    def error(self) -> float | None:
        """The most the offset can be off by: half the best round trip (s)."""
        return None if self.best is None else self.best[0] / 2


def process_started() -> float:
    """When this process started, on time.time()'s clock.

    psutil's `create_time()` is exact on macOS, but on Linux it adds the process's start (clock
    ticks since boot, /proc/self/stat) to /proc/stat's boot time, which is whole seconds, so it
    can read up to a second early: a task could seem to start before the launch that started
    it. On Linux the boot time comes from /proc/uptime instead (hundredths of a second);
    anywhere else, or if /proc cannot be read, psutil's answer."""
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # starttime (proc(5))
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        import psutil

        return psutil.Process().create_time()
