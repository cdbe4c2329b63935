"""Quick mode, paths and seeding shared by every notebook."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
# notebooks/<this>: each lesson's measured wall time and peak memory per mode, written by
# `python -m tools.run_notebooks --record-times`, read by `make index` and the doctor
RUN_TIMES_FILE = "run_times.json"
_TRUE = {"1", "true", "yes", "on"}


def run_times_path(folder: Path | None = None) -> Path:
    """Where the measured run times of the notebooks in `folder` (default notebooks/) lie."""
    return Path(folder or REPO_ROOT / "notebooks") / RUN_TIMES_FILE


def run_times(folder: Path | None = None) -> dict:
    """Per notebook and mode, what `make run` measured (RUN_TIMES_FILE in `folder`, by default
    notebooks/): wall time, cores, date, peak memory; {} before the first measurement."""
    import json

    path = run_times_path(folder)
    return json.loads(path.read_text()) if path.is_file() else {}


_FALSE = {"", "0", "false", "no", "off"}


def env_flag(name: str, default: bool = False) -> bool:
    """Parse a boolean environment variable, refusing values that are neither."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name} must be one of 1/0, true/false, yes/no, on/off, got {raw!r}: fix or unset {name}"
    )


def is_quick() -> bool:
    """True when LABS_QUICK asks for the small CI-sized runs."""
    return env_flag("LABS_QUICK")


def scale(full, quick=None):
    """Return `quick` in quick mode and `full` otherwise.

    Args:
        full: the value for a full run (the real lesson).
        quick: the value for a quick run (CI); defaults to `full`.
    """
    if quick is None:
        return full
    return quick if is_quick() else full


def _dir_from_env(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return Path(raw).expanduser().resolve()


def data_dir() -> Path:
    """The download cache: LABS_DATA_DIR, by default data/ at the repo root."""
    return _dir_from_env("LABS_DATA_DIR", REPO_ROOT / "data")


def runs_dir(*parts: str, create: bool = True) -> Path:
    """A folder under runs/ (LABS_RUNS_DIR) for logs, features and results."""
    path = _dir_from_env("LABS_RUNS_DIR", REPO_ROOT / "runs").joinpath(*parts)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and TensorFlow in one call.

    Args:
        seed: a non-negative integer.
        deterministic: also make TF ops deterministic (slower; same results each run).
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    import tensorflow as tf  # imported here so data-only code need not load TF

    tf.random.set_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def pick_device(verbose: bool = True) -> str:
    """Return "/GPU:0" when TF sees a GPU, else "/CPU:0", and say which and why."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    device = "/GPU:0" if gpus else "/CPU:0"
    if verbose:
        why = f"{len(gpus)} GPU(s) visible" if gpus else "no GPU visible to TensorFlow"
        print(f"Using {device} ({why}).")
    return device
