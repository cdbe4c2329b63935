"""What a run's events say: their kinds, and the stamps of a worker's step.

Every line of a process's event log is one event: {"t": wall time, "kind": a Kind, ...its
fields}. The kinds, who writes them and with which fields, are listed once, in Kind; writers
and readers both use its members (they are strings, so a DataFrame's `kind` column compares
with them directly), and rundir.EventLog.write refuses a kind that is not one of them. Where
the logs lie and how they are read back is rundir's concern.
"""

from __future__ import annotations

import enum
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


PS_STAMPS = ("reached", "granted")  # read on PS task 0's clock when the step fetched


class StepStamps(NamedTuple):
    """Wall-clock times (time.time(), s) of one worker step's phases, in order.

    A step is: reach the PS, wait for its token, pull the parameters, compute the gradient,
    push it;
    then a simulated straggler sleeps its delay (the event's delay_s) after `returned`.
    The stamps in the middle are tf.timestamp() taken inside the step function, the token's
    on PS task 0 itself (PS_STAMPS): on several hosts, two clocks (rundir puts both on the
    driver's).
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

    def took(self) -> dict[str, float]:
        """Seconds of the step's pull, compute and push (each phase's spans added up)."""
        took = {"pull": 0.0, "compute": 0.0, "push": 0.0}
        for name, start, end in self.phases():
            if name in took:
                took[name] += end - start
        return took
