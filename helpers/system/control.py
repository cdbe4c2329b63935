"""The control protocol between a parent and the children it starts: one JSON object a line.

Parent to child, on the child's stdin (the cluster's nodes only):

    {"cmd": "run", "config": "<run dir>/config.json", "worker_pids": {"0": pid, ...}}
    {"cmd": "exit"}
    {"cmd": "ping", "t": driver time}       a node on another host: answer at once (pong)
    {"cmd": "dead", "worker": w}            to PS task 0 on another host: worker w is gone

Child to parent, on the child's protocol stream (its stdout; a node keeps its real stdout
for this and sends its prints to stderr, the log):

    {"event": "ready", ...}          the child is up (a node adds job, task and pid)
    {"event": "training"}            a TF_CONFIG task has started training (logs and tests)
    {"event": "done", "result": {...}, "run": run id (a node)}
    {"event": "error", "error": "Type: message", "run": run id}
    {"event": "pong", "t": the ping's t, "node_t": the node's clock}

and, added by the parent's reader (ChildProcess) when the child's stdout closes:

    {"event": "eof"}

Who speaks it: helpers.cluster.node and .launcher (all of it), helpers.cluster.strategies
(ready, training, done), helpers.training.mirrored (done); helpers.system.processes carries it.
"""

from __future__ import annotations

import enum
import json


class Cmd(enum.StrEnum):
    """What a parent tells a node."""

    RUN = "run"  # fields: config (path of the RunConfig JSON), worker_pids
    EXIT = "exit"
    PING = "ping"  # field: t (the driver's clock); a node on another host answers PONG at once
    DEAD = "dead"  # field: worker (a worker on another host is gone; to PS task 0)


class Event(enum.StrEnum):
    """What a child tells its parent."""

    READY = "ready"
    TRAINING = "training"
    DONE = "done"  # field: result (any JSON)
    ERROR = "error"  # field: error ("Type: message")
    PONG = "pong"  # fields: t (the ping's), node_t (the node's clock when it answered)
    EOF = "eof"  # never sent: the parent's reader adds it when the child's stdout closes


def command(cmd: Cmd, **fields) -> dict:
    """A message to a child (ValueError for a command not in Cmd)."""
    return {"cmd": str(Cmd(cmd)), **fields}


def event_writer(stream):
    """A `say(event, **fields)` that writes event lines to `stream` and flushes, one whole line
    at a time: a child's main thread and its lifeline's reader (a ping's answer) both say."""
    import threading

    lock = threading.Lock()

    def say(event: Event, **fields) -> None:
        with lock:
            stream.write(event_line(event, **fields))
            stream.flush()

    return say


def event_line(event: Event, **fields) -> str:
    """A child's message as the JSON line it writes (ValueError for an event not in Event)."""
    return json.dumps({"event": str(Event(event)), **fields}) + "\n"
