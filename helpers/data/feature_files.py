"""Feature files: the document vectors notebook 01 saves and notebook 02 loads, all or nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from helpers import config, files
from helpers.data.dbpedia import SPLITS


def features_dir() -> Path:
    """Where notebook 01 saves the Doc2Vec features: runs/features/doc2vec_dbpedia."""
    return config.runs_dir("features") / "doc2vec_dbpedia"


def save_features(features: dict, metadata: dict, directory: Path | None = None) -> Path:
    """Write {split: (X, y)} as .npy files plus metadata.json, all or nothing.

    The files go to a temporary folder that replaces `directory` only once complete.
    """
    directory = Path(directory) if directory is not None else features_dir()
    if set(features) != set(SPLITS):
        raise ValueError(f"features must have exactly the splits {SPLITS}, got {sorted(features)}")
    for split, (x, y) in features.items():
        if np.ndim(x) != 2 or np.ndim(y) != 1 or len(x) != len(y):
            raise ValueError(
                f"{split}: X must be 2-D and y 1-D of the same length, "
                f"got shapes {np.shape(x)} and {np.shape(y)}"
            )
    with files.atomic_path(directory, directory=True) as tmp:
        for split, (x, y) in features.items():
            np.save(tmp / f"{split}_X.npy", np.asarray(x, dtype=np.float32))
            np.save(tmp / f"{split}_y.npy", np.asarray(y, dtype=np.int64))
        meta = dict(
            metadata,
            quick=config.is_quick(),
            shapes={s: list(np.shape(x)) for s, (x, _) in features.items()},
        )
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2, default=_jsonable))
    return directory


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"metadata value {value!r} is not JSON-serialisable")


def load_features(directory: Path | None = None, quick: bool | None = None):
    """Load the features notebook 01 saved.

    Args:
        directory: the folder save_features wrote (default: features_dir()).
        quick: the mode the features must have been made in (default: this run's mode).
    Returns:
        ({split: (X, y)}, metadata dict).
    Raises:
        FileNotFoundError: nothing saved yet (run notebook 01 first).
        ValueError: the features were made in the other mode.
    """
    directory = Path(directory) if directory is not None else features_dir()
    quick = config.is_quick() if quick is None else quick
    mode = "quick (LABS_QUICK=1)" if quick else "full (LABS_QUICK unset)"
    meta_path = directory / "metadata.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no Doc2Vec features in {directory}: run notebooks/01_doc2vec_dbpedia.ipynb "
            f"first, in {mode} mode, to create them"
        )
    meta = json.loads(meta_path.read_text())
    if bool(meta.get("quick")) != quick:
        made = "quick" if meta.get("quick") else "full"
        raise ValueError(
            f"the features in {directory} were made in {made} mode but this run is in {mode} "
            f"mode: re-run notebooks/01_doc2vec_dbpedia.ipynb in {mode} mode"
        )
    out = {}
    for split in SPLITS:
        x, y = np.load(directory / f"{split}_X.npy"), np.load(directory / f"{split}_y.npy")
        if list(x.shape) != meta["shapes"][split] or len(y) != len(x):
            raise ValueError(
                f"{directory}/{split}_X.npy has shape {x.shape}, metadata says "
                f"{meta['shapes'][split]}: re-run notebooks/01_doc2vec_dbpedia.ipynb"
            )
        out[split] = (x, y)
    return out, meta
