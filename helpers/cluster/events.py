"""JSON-lines event logs written by every cluster process, and reading them back.

Every line is one event: {"t": wall time, "kind": a Kind, ...its fields}. The kinds, who
writes them and with which fields, are listed once, in Kind; writers and readers both use
its members (they are strings, so a DataFrame's `kind` column compares with them directly),
and EventLog.write refuses a kind that is not one of them.
"""

from __future__ import annotations

import enum
import json
import time
from pathlib import Path
from typing import NamedTuple


class Kind(enum.StrEnum):
    """The events of a run: who writes each (file ps-0, worker-N or evaluator-0), with what."""

    START = "start"  # PS, a run begins: mode, workers, version
    JOINED = "joined"  # PS, every worker pulled its first parameters: workers
    STEP = "step"  # worker, a step is done: worker, step, version read, compute/wait/delay s,
    #   bytes, stamps (a StepStamps as a list), ...
    DONE = "done"  # worker, its last step: worker, steps
    UPDATE = "update"  # PS, one update applied: version, lr, and per push: workers, steps,
    #   versions (read), staleness, weights, fresh
    DROP = "drop"  # PS, a late gradient dropped: worker, step, version, staleness
    CHECKPOINT = "checkpoint"  # PS, parameters saved: version, file
    RESUME = "resume"  # PS, a run resumed from a checkpoint: version, file
    EVAL = "eval"  # evaluator, a checkpoint tested: version, test_accuracy, file
    FAULT = "fault"  # PS or worker, an injected fault fires: what, version or step
    DEAD = "dead"  # PS, a worker's process is gone: worker, pid
    TIMEOUT = "timeout"  # PS, workers silent too long: silent_s, workers
    FINAL = "final"  # PS, the run's end: version, test_accuracy, wall_s


class StepStamps(NamedTuple):
    """Wall-clock times (time.time(), s) of one worker step's phases, in order.

    A step is: reach the PS, wait for its token, pull the parameters, compute the gradient,
    push it;
    then a simulated straggler sleeps its delay (the event's delay_s) after `returned`.
    The stamps in the middle are tf.timestamp() taken inside the step function, the token's
    on the PS itself (one machine: one clock).
    """

    waiting: float  # began waiting: the call's start, or async's one wait for the first token
    called: float  # the step function was called
    reached: float  # on the PS: the call's part there began (= called when it did not fetch)
    granted: float  # on the PS: the token is taken (= reached when the mode does not wait)
    arrived: float  # the parameters are on the worker (= granted when it did not fetch)
    computed: float  # the gradient is computed and added up
    pushed: float  # the PS holds the push (async: has applied it; = computed when not pushed)
    returned: float  # the call has returned to Python

    def phases(self) -> list[tuple[str, float, float]]:
        """(phase, start, end) of each phase that took time: wait, pull, compute, push.

        A pull is two spans: the call's trip to the PS, and the parameters' trip back; the
        wait for the token (and async's first wait) lies between them.

        The call's return to Python counts with the push, or with the compute when the step
        did not push (Downpour's accumulating steps).
        """
        end_of_compute = self.computed if self.pushed > self.computed else self.returned
        spans = [
            ("wait", self.waiting, self.called),
            ("pull", self.called, self.reached),
            ("wait", self.reached, self.granted),
            ("pull", self.granted, self.arrived),
            ("compute", self.arrived, end_of_compute),
            ("push", end_of_compute, self.returned),
        ]
        return [(name, a, b) for name, a, b in spans if b > a]


class EventLog:
    """Append one JSON object per line to <run_dir>/<name>.jsonl, flushed at once."""

    def __init__(self, run_dir: Path, name: str):
        self.path = Path(run_dir) / f"{name}.jsonl"
        self._f = open(self.path, "a", buffering=1)

    def write(self, kind: Kind, **fields) -> None:
        """Record one event with its wall time (ValueError for a kind not in Kind)."""
        fields = {"t": time.time(), "kind": str(Kind(kind)), **fields}
        self._f.write(json.dumps(fields) + "\n")

    def close(self) -> None:
        """Flush and close the file."""
        self._f.close()


class EventTail:
    """The events appended to a run's .jsonl files since the last call, as they are written.

    For watching a run live (progress bars, the launcher's stall watchdog): each call reads
    only the new complete lines of each file (a line still being written waits for the next
    call) and returns them parsed, each with its `source` (the file's stem, e.g. "ps-0").
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[dict]:
        """The new events of every file of the run, file by file."""
        new = []
        for path in sorted(self.run_dir.glob("*.jsonl")):
            start = self.offsets.get(path, 0)
            if path.stat().st_size == start:  # polled every 0.2 s: open only what grew
                continue
            with open(path, "rb") as f:
                f.seek(start)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[path] = start + len(complete)
            for line in complete.splitlines():
                new.append({**json.loads(line), "source": path.stem})
        return new


def read_events(run_dir: Path):
    """All events of a run as one pandas DataFrame sorted by wall time, with a `source` column."""
    import pandas as pd

    rows = []
    for path in sorted(Path(run_dir).glob("*.jsonl")):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):  # a line still being written is skipped
                    row = json.loads(line)
                    row["source"] = path.stem
                    rows.append(row)
    frame = pd.DataFrame(rows)
    if len(frame):
        frame = frame.sort_values("t", kind="stable").reset_index(drop=True)
    return frame
