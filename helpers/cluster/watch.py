"""What a launcher knows about the run it is watching (LocalCluster.train): the processes yet to
report done, their results, a protocol error, the event log read so far, and the stall
watchdog's view of it: whether this attempt's workers have joined and when anything last
happened, hence which time limit applies now."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from helpers.cluster.dashboard import Dashboard
from helpers.cluster.events import Kind
from helpers.cluster.rundir import EventTail


@dataclass
class RunWatch:
    """One run being watched. `since`: a time taken before the run's RUN command was sent."""

    waiting: set  # processes that have not reported done
    tail: EventTail
    board: Dashboard | None
    since: float
    results: dict = field(default_factory=dict)
    ps_error: str | None = None  # a protocol error the PS reported (the cluster lives on)
    started: bool = False  # PS task 0 logged this attempt's START
    joined: bool = False  # every worker has traced its step and joined, in this attempt
    last_progress: float = field(default_factory=time.monotonic)

    def read(self) -> list[dict]:
        """The events written since the last call; they are progress. A resumed run's log
        also holds earlier attempts' START and JOINED, however recent: this attempt's JOINED
        is the one PS task 0 logs after this attempt's START, logged after `since`."""
        events = self.tail.read()
        if events:
            self.last_progress = time.monotonic()
        if self.joined:  # nothing more to look for in them
            return events
        for e in events:  # each file's events in the order they were written
            if e["source"] == "ps-0" and e["kind"] == Kind.START and e["t"] >= self.since:
                self.started = True
            elif e["kind"] == Kind.JOINED and self.started:
                self.joined = True
        return events

    def overdue(self, start_timeout: float, stall_timeout: float) -> tuple[float, str] | None:
        """The limit passed with no progress and its name, or None: start_timeout until the
        workers join in this attempt (tracing is slow on a busy machine), then stall_timeout."""
        limit = stall_timeout if self.joined else start_timeout
        if time.monotonic() - self.last_progress <= limit:
            return None
        return limit, "stall_timeout" if self.joined else "start_timeout: workers never joined"
