"""JSON-lines event logs written by every cluster process, and reading them back."""
from __future__ import annotations

import json
import time
from pathlib import Path


class EventLog:
    """Append one JSON object per line to <run_dir>/<name>.jsonl, flushed at once."""

    def __init__(self, run_dir: Path, name: str):
        self.path = Path(run_dir) / f"{name}.jsonl"
        self._f = open(self.path, "a", buffering=1)

    def write(self, kind: str, **fields) -> None:
        """Record one event with its wall time."""
        fields = {"t": time.time(), "kind": kind, **fields}
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
