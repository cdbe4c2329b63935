"""Fetch and verify every dataset the notebooks use (idempotent: cached files are re-hashed)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import data, downloads  # noqa: E402


def main() -> int:
    try:
        mnist = downloads.fetch("mnist")
        print(f"mnist    ok  {mnist}")
        folder = data.dbpedia_dir()
        counts = {}
        for split in ("train", "test"):  # parses every row: a bad file fails here, not mid-lesson
            counts[split] = sum(1 for _ in data.iter_dbpedia(split))
        print(f"dbpedia  ok  {folder} ({counts['train']:,} train / {counts['test']:,} test rows, "
              f"{len(data.dbpedia_classes())} classes)")
    except downloads.DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
