"""A run's record on disk: the one module that writes and reads it.

A cluster's folder, runs/<cluster-name>/, holds its cluster file and one log per process. A
run's folder, runs/<run-id>/ (or any folder a standalone run names), holds:

    config.json           the run configuration (RunConfig) and the record's schema version
    clocks.json           each process's clock offset in seconds, where one is known (absent:
                          every offset is 0, as on one machine)
    <job>-<task>.jsonl    one event log per process: a JSON object per line (events.Kind)
    ckpt/ckpt-NNNNNNN.npz the parameters after NNNNNNN updates, as arrays w0, w1, ...
    ckpt/latest.json      the newest checkpoint: {"file", "version"}

Every reader and writer goes through here: the PS and the evaluator (checkpoints), the node
(cluster file, configuration, event logs), the launcher, Run, runlogs, timeline, costmodel
and the dashboard (events, time zero, the number of PS tasks). A record carries its schema
version; one written by a newer version of this code is refused with an error naming both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from helpers import files
from helpers.cluster.events import PS_STAMPS, Kind, StepStamps
from helpers.system import clock

SCHEMA = 1  # the record's layout; a record without a version is of version 1


class RecordError(ValueError):
    """A record this code cannot read: its schema version is newer, or a part is missing."""


def check_schema(found, where) -> None:
    """Refuse a record whose schema version this code does not know."""
    version = 1 if found is None else found
    if not isinstance(version, int) or not 1 <= version <= SCHEMA:
        raise RecordError(
            f"{where} has record schema {found!r}; this code reads schema 1 to {SCHEMA}: "
            "read it with the version of the project that wrote it, or update this one"
        )


# ----------------------------------------------------------------------- the cluster file
def write_cluster(path: Path, jobs: dict[str, list[str]]) -> Path:
    """Write a cluster file: each job's task addresses ({"ps": [...], "worker": [...]})."""
    if not jobs.get("ps"):
        raise ValueError(f"a cluster needs at least one PS address, got {jobs!r}")
    files.write_json(Path(path), {"schema": SCHEMA, **jobs}, indent=1)
    return Path(path)


def read_cluster(path: Path) -> dict[str, list[str]]:
    """Each job's task addresses from a cluster file (one written by hand needs no version)."""
    body = json.loads(Path(path).read_text())
    check_schema(body.pop("schema", None), f"cluster file {path}")
    if not body.get("ps"):
        raise RecordError(f'cluster file {path} lists no PS address: add "ps": ["host:port"]')
    return body


# ----------------------------------------------------------------------------- checkpoints
@dataclass(frozen=True)
class Checkpoint:
    """One saved set of parameters: after `version` updates, in ckpt/`file`."""

    version: int
    file: str

    @classmethod
    def of(cls, version: int) -> Checkpoint:
        """The checkpoint taken after `version` updates."""
        return cls(int(version), f"ckpt-{int(version):07d}.npz")


class RunDir:
    """The folder of one run (see the module's docstring for what lies in it)."""

    CONFIG, CLOCKS, CKPT = "config.json", "clocks.json", "ckpt"

    def __init__(self, path: Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ------------------------------------------------------------------- configuration
    def write_config(self, cfg) -> Path:
        """Write the run's configuration (a RunConfig), with the schema version."""
        self.path.mkdir(parents=True, exist_ok=True)
        return files.write_json(
            self.path / self.CONFIG, {"schema": SCHEMA, **cfg.to_dict()}, indent=1
        )

    @staticmethod
    def read_config(path: Path):
        """The RunConfig in a configuration file and the RunDir its run writes to.

        The run's folder is the file's own, unless the file names another ("run_dir"), as a
        run file written by hand for several machines may.
        """
        from helpers.cluster.protocol import RunConfig

        body = json.loads(Path(path).read_text())
        check_schema(body.pop("schema", None), f"run configuration {path}")
        run_dir = body.pop("run_dir", None) or Path(path).parent
        return RunConfig.from_dict(body), RunDir(run_dir)

    # -------------------------------------------------------------------- clock offsets
    def write_clock_offsets(self, offsets: dict[str, float]) -> Path:
        """Record how far each process's clock is ahead (s), by its log's name ("worker-1")."""
        body = {"schema": SCHEMA, "offsets": {k: float(v) for k, v in offsets.items()}}
        return files.write_json(self.path / self.CLOCKS, body, indent=1)

    def clock_offsets(self) -> dict[str, float]:
        """Each process's clock offset (s) by its log's name; {} when none was recorded."""
        path = self.path / self.CLOCKS
        if not path.exists():
            return {}
        body = json.loads(path.read_text())
        check_schema(body.get("schema"), f"clock offsets {path}")
        return {k: float(v) for k, v in body["offsets"].items()}

    # --------------------------------------------------------------------------- events
    def log(self, name: str) -> EventLog:
        """The event log a process writes (`name`: "ps-0", "worker-1", "evaluator-0")."""
        return EventLog(self.path, name)

    def tail(self) -> EventTail:
        """A reader of the events appended since its last call, for watching a run live."""
        return EventTail(self.path, self.clock_offsets)

    def events(self):
        """All events as one DataFrame sorted by time, with a `source` column (the log's name);
        times are on the driver's clock (each process's recorded offset taken off)."""
        import pandas as pd

        offsets, rows = self.clock_offsets(), []
        for path in sorted(self.path.glob("*.jsonl")):
            with open(path) as f:
                rows += [
                    _parsed(line, path.stem, offsets) for line in f if line.endswith("\n")
                ]  # a line still being written is skipped
        frame = pd.DataFrame(rows)
        if len(frame):
            frame = frame.sort_values("t", kind="stable").reset_index(drop=True)
        return frame

    # ---------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, version: int, values) -> Checkpoint:
        """Save the parameters after `version` updates, all or nothing, and mark them newest."""
        ckpt = Checkpoint.of(version)
        folder = self.path / self.CKPT
        with files.atomic_path(folder / ckpt.file, ".npz") as tmp:
            np.savez(tmp, **{f"w{i}": v for i, v in enumerate(values)})
        latest = {"file": ckpt.file, "version": ckpt.version}
        files.write_json(folder / "latest.json", latest, indent=1)
        return ckpt

    def latest_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint saved, or None."""
        path = self.path / self.CKPT / "latest.json"
        if not path.exists():
            return None
        body = json.loads(path.read_text())
        return Checkpoint(int(body["version"]), body["file"])

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint on disk, oldest first."""
        found = sorted((self.path / self.CKPT).glob("ckpt-*.npz"))
        return [Checkpoint(int(p.stem.removeprefix("ckpt-")), p.name) for p in found]

    def load_checkpoint(self, which: int | str | Checkpoint) -> list[np.ndarray]:
        """The parameters of a checkpoint, given by version, file name or Checkpoint."""
        if isinstance(which, Checkpoint):
            which = which.file
        name = which if isinstance(which, str) else Checkpoint.of(which).file
        path = self.path / self.CKPT / name
        if not path.exists():
            have = [c.version for c in self.checkpoints()]
            raise RecordError(f"no checkpoint {name} in {path.parent}; versions saved: {have}")
        with np.load(path) as f:
            return [f[f"w{i}"] for i in range(len(f.files))]


def _parsed(line: str, source: str, offsets: dict[str, float]) -> dict:
    """One event, its times on the driver's clock: each stamp less the offset of the clock
    that read it (a step's token stamps are read on PS task 0, when the step fetched). The
    offsets are known to within half a round trip, so the PS's stamps are kept between the
    worker's own around them, as they were in fact."""
    row = json.loads(line)
    row["source"] = source
    own = offsets.get(source, 0.0)
    row["t"] -= own
    stamps = row.get("stamps")
    if stamps is not None and row.get("kind") == Kind.STEP and offsets:
        ps = offsets.get("ps-0", 0.0) if row.get("fetched", True) else own
        s = StepStamps(
            *(v - (ps if f in PS_STAMPS else own) for f, v in zip(StepStamps._fields, stamps))
        )
        if ps != own:  # two clocks, each offset known to half a round trip: keep the order
            reached = min(max(s.reached, s.called), s.arrived)
            s = s._replace(reached=reached, granted=min(max(s.granted, reached), s.arrived))
        row["stamps"] = list(s)
    return row


# -------------------------------------------------------------------------------- events
class EventLog:
    """Append one JSON object per line to <run_dir>/<name>.jsonl, flushed at once."""

    def __init__(self, run_dir: Path, name: str):
        self.path = Path(run_dir) / f"{name}.jsonl"
        self._f = open(self.path, "a", buffering=1)

    def write(self, kind: Kind, **fields) -> None:
        """Record one event with its wall time (ValueError for a kind not in Kind)."""
        fields = {"t": clock.now(), "kind": str(Kind(kind)), **fields}
        self._f.write(json.dumps(fields) + "\n")

    def close(self) -> None:
        """Flush and close the file."""
        self._f.close()


class EventTail:
    """The events appended to a run's .jsonl files since the last call, as they are written.

    For watching a run live (the dashboard, the launcher's stall watchdog): each call reads
    only the new complete lines of each file (a line still being written waits for the next
    call) and returns them parsed, each with its `source` (the file's stem, e.g. "ps-0").
    """

    def __init__(self, run_dir: Path, clock_offsets: Callable[[], dict] | None = None):
        self.run_dir = Path(run_dir)
        self.read_to: dict[Path, int] = {}  # each file's bytes read so far
        self._clock_offsets = clock_offsets or dict  # asked at each read that finds new lines

    def read(self) -> list[dict]:
        """The new events of every file of the run, file by file."""
        new, clocks = [], None
        for path in sorted(self.run_dir.glob("*.jsonl")):
            start = self.read_to.get(path, 0)
            if path.stat().st_size == start:  # polled often: open only what grew
                continue
            with open(path, "rb") as f:
                f.seek(start)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.read_to[path] = start + len(complete)
            clocks = self._clock_offsets() if clocks is None else clocks
            new += [_parsed(line.decode(), path.stem, clocks) for line in complete.splitlines()]
        return new


def read_events(run_dir: Path):
    """All events of the run in `run_dir` (RunDir.events)."""
    return RunDir(run_dir).events()


# ---------------------------------------------------------------------- what events say
def time_zero(events) -> float:
    """The run's time zero: when every worker had first joined (set up and warmed up), else
    the PS's first start, else the first event. Set-up and warm-up come before it."""
    for kind in (Kind.JOINED, Kind.START):
        found = events[events.kind == kind]
        if len(found):
            return float(found.t.min())
    return float(events.t.min())


def first_start(events) -> float:
    """When the PS first started the run, before the workers' set-up (else time_zero)."""
    start = events[events.kind == Kind.START]
    return float(start.t.min()) if len(start) else time_zero(events)


def last_attempt_window(events) -> tuple[float, float]:
    """Start and end of the latest attempt's training: from its workers' joining to the last
    update (a resumed run's record holds every attempt; this is the one just made)."""
    joined = events[events.kind == Kind.JOINED]
    updates = events[events.kind == Kind.UPDATE]
    if not len(joined) or not len(updates):
        raise RecordError("the run never trained: its record has no 'joined' or no 'update'")
    return float(joined.t.max()), float(updates.t.max())


def ps_tasks(events) -> int:
    """How many PS tasks held the parameters (PS task 0 logs it when a run starts)."""
    start = events[events.kind == Kind.START]
    if not len(start) or "ps" not in start:
        raise RecordError("the run's record has no 'start' event naming its PS tasks")
    return int(start.ps.iloc[-1])
