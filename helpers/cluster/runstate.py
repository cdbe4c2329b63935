"""What a cluster run is doing, read from its events as they are written.

`RunState` follows a run from its event logs (events.EventTail hands it each new batch) and
answers, at any moment: per worker, its clock (steps done), the PS version it last read, how
stale that is now, what it is doing (starting, computing, waiting for a token, stopped, dead,
silent (hung?), done), its steps/s and its last step's split into wait, pull, compute and
push; for the PS, its version, updates/s, the pushes it holds, drops and folds. It is plain
Python over the events, so it is tested on real runs' logs; dashboard.py draws it.

What a worker is doing is read from the protocol, since no event says "now waiting": a sync or
backup worker waits for a token from its push until the PS's version passes the one it read;
an SSP worker waits while its clock is more than the bound ahead of the slowest live worker
(protocol.ssp_may_step, the gate the PS's grants follow); an async worker never waits after its
first step.
The PS logs an update before it grants the tokens that update frees, so a worker this reading
calls waiting has not been granted its next step yet.
"""

from __future__ import annotations

import statistics
from collections import deque

from helpers.cluster import protocol
from helpers.cluster.events import Kind, StepStamps

RATE_WINDOW_S = 2.0  # steps/s and updates/s: over the last this many seconds
HUNG_AFTER = 10  # a computing worker silent this many of its median steps (and 2 s) is "hung?"
MAX_POINTS = 400  # per worker in the live plot; older points are thinned


class _Worker:
    def __init__(self):
        self.clock = 0  # steps done
        self.version_read = None
        self.last_t = None  # wall time of its last step event
        self.step_times: deque = deque(maxlen=256)  # end times of recent steps
        self.durations: deque = deque(maxlen=32)  # recent steps' lengths
        self.phases: dict[str, float] = {}  # the last step's phases, seconds
        self.done = self.dead = False
        self.points: list[tuple[float, int]] = []  # (time, clock) for the live plot


class RunState:
    """A run as its events tell it, updated batch by batch (see the module's docstring)."""

    def __init__(self, cfg):
        self.mode, self.bound = cfg.mode, cfg.staleness if cfg.mode == "ssp" else None
        self.fold = cfg.mode == "backup" and cfg.stale == "fold"
        self.steps_total = cfg.steps
        self.workers = {w: _Worker() for w in cfg.worker_ids}
        self.ps_clock = {w: 0 for w in cfg.worker_ids}  # pushes the PS applied, per worker
        self.version = None  # the PS's version, from its events
        self.updates = 0  # in this run
        self.update_times: deque = deque(maxlen=1024)
        self.pushes_sent = self.pushes_used = self.drops = self.folds = 0
        # the attempt being watched (a resumed run's logs hold earlier ones): its start and its
        # workers' joining, as rundir.last_attempt_window takes them
        self.started = None  # wall time the run began (the PS's start event)
        self.joined = None  # wall time every worker joined
        self.final = None  # the PS's final event
        self.stopped: set[int] = set()  # workers whose process is stopped (SIGSTOP)
        self.ps_stopped = False  # the PS's process is stopped
        self.bound_points: list[tuple[float, float]] = []  # SSP: (time, slowest clock + s)

    # ------------------------------------------------------------------ reading events
    def feed(self, events: list[dict]) -> None:
        """Take a batch of new events (dicts with `kind`, `t` and their fields)."""
        for e in events:
            kind, t = e["kind"], e["t"]
            if kind == Kind.START:
                self.started, self.version = t, int(e["version"])
            elif kind == Kind.JOINED:
                self.joined = t
            elif kind == Kind.STEP and int(e["worker"]) in self.workers:
                self._step(e)
            elif kind == Kind.UPDATE:
                self.version = int(e["version"])
                self.updates += 1
                self.update_times.append(t)
                self.pushes_used += len(e["workers"])
                for w in e["workers"]:
                    if int(w) in self.ps_clock:
                        self.ps_clock[int(w)] += 1
                if self.fold:
                    self.folds += sum(
                        1 for f, wt in zip(e["fresh"], e["weights"]) if not f and wt > 0
                    )
            elif kind == Kind.DROP:
                self.drops += 1
                self.pushes_used += 1
            elif kind == Kind.DONE and int(e["worker"]) in self.workers:
                self.workers[int(e["worker"])].done = True
            elif kind == Kind.DEAD and int(e["worker"]) in self.workers:
                self.workers[int(e["worker"])].dead = True
            elif kind == Kind.FINAL:
                self.final = e
        if self.bound is not None and events:
            live = [self.ps_clock[w] for w, s in self.workers.items() if not (s.dead or s.done)]
            if live:
                self.bound_points.append((events[-1]["t"], min(live) + self.bound))
                self.bound_points = _thin(self.bound_points)

    def _step(self, e: dict) -> None:
        w = self.workers[int(e["worker"])]
        w.clock = int(e["step"]) + 1
        w.version_read = int(e["version_read"])
        if w.last_t is not None:
            w.durations.append(e["t"] - w.last_t)
        w.last_t = e["t"]
        w.step_times.append(e["t"])
        if e.get("pushed") and e["step"] >= 0:
            self.pushes_sent += 1
        if e.get("stamps"):
            w.phases = {}
            for name, a, b in StepStamps(*e["stamps"]).phases():  # a pull is two spans
                w.phases[name] = w.phases.get(name, 0.0) + (b - a)
            if e.get("delay_s"):
                w.phases["delay"] = e["delay_s"]
        w.points.append((e["t"], w.clock))
        w.points = _thin(w.points)

    # ------------------------------------------------------------------ what is happening
    def doing(self, w: int, now: float) -> str:
        """What worker w is doing now, by the protocol's rules (module docstring)."""
        s = self.workers[w]
        if s.dead:
            return "dead"
        if w in self.stopped:
            return "stopped"
        if s.done or self.final is not None:
            return "done"
        if self.joined is None:
            return "starting"
        if (
            self.mode in ("sync", "backup")
            and None not in (self.version, s.version_read)
            and self.version <= s.version_read
        ):
            return "waiting for a token"
        if self.mode == "ssp":
            live = [
                self.ps_clock[v]
                for v, o in self.workers.items()
                if not (o.dead or o.done) and v not in self.stopped
            ]
            if not protocol.ssp_may_step(s.clock, live, self.bound):
                return "waiting for a token"
        typical = statistics.median(s.durations) if s.durations else 0.0
        if now - (s.last_t or self.joined) > max(2.0, HUNG_AFTER * typical):
            return "silent (hung?)"
        return "computing"

    def staleness(self, w: int) -> int | None:
        """How many PS updates the parameters worker w last read are behind the PS now."""
        s = self.workers[w]
        if s.version_read is None or self.version is None:
            return None
        return max(0, self.version - s.version_read)

    def _rate(self, times, count: int, now: float) -> float:
        """Events per second: over the last RATE_WINDOW_S while the run goes, over the whole
        run (since every worker joined) once it has finished."""
        t0 = self.joined or self.started
        if t0 is None or now <= t0:
            return 0.0
        if self.final is not None:
            return count / max(self.final["t"] - t0, 1e-9)
        window = min(RATE_WINDOW_S, now - t0)
        return sum(1 for t in times if t > now - window) / window

    def frame(self, now: float | None = None) -> dict:
        """Everything the dashboard shows at time `now` (default: the last event's time)."""
        if self.final is not None:  # a finished run is shown as it ended
            now = self.final["t"]
        elif now is None:
            now = max([s.last_t for s in self.workers.values() if s.last_t] + [self.started or 0])
        workers = [
            {
                "worker": w,
                "clock": s.clock,
                "version read": s.version_read,
                "staleness": self.staleness(w),
                "doing": self.doing(w, now),
                "steps/s": self._rate(s.step_times, s.clock, now),
                "last step": dict(s.phases),
            }
            for w, s in self.workers.items()
        ]
        ps_stats = {
            "version": self.version,
            "updates": self.updates,
            "of": self.steps_total,
            "updates/s": self._rate(self.update_times, self.updates, now),
            "pending pushes": (
                None if self.mode == "async" else max(0, self.pushes_sent - self.pushes_used)
            ),
            "drops": self.drops,
            "folds": self.folds if self.fold else None,
            "elapsed_s": now - (self.joined or self.started) if self.started else 0.0,
        }
        return {
            "mode": self.mode,
            "bound": self.bound,
            "workers": workers,
            "ps": ps_stats,
            "finished": self.final is not None,
            "warming up": self.joined is None,
            "ps stopped": self.ps_stopped,
        }


def _thin(points: list) -> list:
    """Keep a plot cheap: past MAX_POINTS, drop every other point of the older half."""
    if len(points) <= MAX_POINTS:
        return points
    half = len(points) // 2
    return points[:half:2] + points[half:]
