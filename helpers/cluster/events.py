"""JSON-lines event logs written by every cluster process, and reading them back."""
from __future__ import annotations

import json
import os
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


def atomic_write_json(path: Path, obj) -> None:
    """Write JSON to a temporary file, then rename it over `path`."""
    tmp = Path(f"{path}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)
