"""Fetch and verify every dataset the notebooks use (idempotent: cached files are re-hashed)."""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: become `python -m tools.fetch_data`
    from helpers.system.processes import exec_as_module

    exec_as_module("tools.fetch_data")

import sys

from helpers.data import dbpedia, downloads


def main() -> int:
    try:
        mnist = downloads.fetch("mnist")
        print(f"mnist    ok  {mnist}")
        folder = dbpedia.dbpedia_dir()
        counts = {}
        for split in ("train", "test"):  # parses every row: a bad file fails here, not mid-lesson
            counts[split] = sum(1 for _ in dbpedia.iter_dbpedia(split))
        print(
            f"dbpedia  ok  {folder} ({counts['train']:,} train / {counts['test']:,} test rows, "
            f"{len(dbpedia.dbpedia_classes())} classes)"
        )
    except downloads.DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
