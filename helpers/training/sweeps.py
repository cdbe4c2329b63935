"""Run a grid of configurations, caching each finished run as JSON under runs/."""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Iterable

from tqdm.auto import tqdm

from helpers import config as _config
from helpers import files


def config_key(cfg: dict) -> str:
    """Hash a JSON-serialisable config (key order does not matter) to a short hex key."""
    try:
        text = json.dumps(cfg, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"sweep config must be plain JSON (str, numbers, lists, dicts), got {cfg!r}: {err}"
        ) from None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_sweep(
    name: str, configs: Iterable[dict], run: Callable[[dict], dict], desc: str | None = None
) -> list[dict]:
    """Run `run(cfg)` for each config not already cached; return every record.

    Args:
        name: the sweep's folder under runs/sweeps/ (one per experiment).
        configs: JSON-serialisable dicts; each one's hash names its cache file.
        run: trains one configuration and returns a JSON-serialisable dict of results.
        desc: label of the progress bar.

    Returns:
        One dict per config, in order: {"config", "result", "cached"}.
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"sweep name must be a plain folder name, got {name!r}")
    folder = _config.runs_dir("sweeps", name)
    configs = list(configs)
    keys = [config_key(c) for c in configs]  # validates every config before any training
    records = []
    bar = tqdm(list(zip(configs, keys)), desc=desc or name)
    for cfg, key in bar:
        path = folder / f"{key}.json"
        if path.exists():
            records.append(
                {"config": cfg, "result": json.loads(path.read_text())["result"], "cached": True}
            )
            continue
        result = run(cfg)
        files.write_json(path, {"config": cfg, "result": result})  # never half a record
        records.append({"config": cfg, "result": result, "cached": False})
    return records


def clear_sweep(name: str) -> int:
    """Delete a sweep's cached runs; return how many files were removed."""
    folder = _config.runs_dir("sweeps", name)
    records = list(folder.glob("*.json"))
    for f in records:
        f.unlink()
    return len(records)
