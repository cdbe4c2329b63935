"""Loaders for MNIST and DBpedia-14, from the verified cache (see downloads.py)."""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from helpers.downloads import DataError, fetch

DBPEDIA_N_CLASSES = 14


# --------------------------------------------------------------------------- MNIST

def load_mnist():
    """Load MNIST as Keras does: ((x_train, y_train), (x_test, y_test)), uint8 arrays."""
    with np.load(fetch("mnist")) as f:
        return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])


def load_mnist_rows(split: str, rows) -> np.ndarray:
    """Only these rows of MNIST's images (uint8, shape (len(rows), 28, 28)), in this order.

    The images are streamed out of the compressed .npz in 1 MB chunks, so the whole split
    (47 MB for train) is never in memory at once: the cluster's processes each need a few
    thousand rows, and a full decompression added ~56 MB to every process's peak memory.
    """
    import zipfile

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rows = np.asarray(rows, dtype=np.int64)
    with zipfile.ZipFile(fetch("mnist")) as z, z.open(f"x_{split}.npy") as f:
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}[np.lib.format.read_magic(f)]
        shape, fortran, dtype = read_header(f)
        if fortran or dtype != np.uint8 or len(shape) != 3:
            raise DataError(f"unexpected MNIST array x_{split}: {shape} {dtype}; re-download it")
        if len(rows) and not (0 <= rows.min() and rows.max() < shape[0]):
            raise ValueError(f"rows must be in [0, {shape[0]}), got {rows.min()}..{rows.max()}")
        row_bytes = int(np.prod(shape[1:]))
        out = np.empty((len(rows), *shape[1:]), np.uint8)
        by_row = np.argsort(rows, kind="stable")  # positions in `out`, sorted by row number
        sorted_rows, i = rows[by_row], 0
        per_chunk = max(1, 2**20 // row_bytes)
        for start in range(0, shape[0], per_chunk):
            count = min(per_chunk, shape[0] - start)
            if i >= len(rows):
                break
            chunk = np.frombuffer(f.read(count * row_bytes), np.uint8).reshape(count, *shape[1:])
            j = np.searchsorted(sorted_rows, start + count, side="left")
            out[by_row[i:j]] = chunk[sorted_rows[i:j] - start]
            i = j
    return out


# --------------------------------------------------------------------------- DBpedia

class DbpediaRow(NamedTuple):
    line: int  # 1-based line number in the CSV
    label: int  # 0..13, i.e. the file's class index minus one
    title: str
    content: str


def dbpedia_dir() -> Path:
    """The folder with train.csv/test.csv/classes.txt: LABS_DBPEDIA_DIR, else the download."""
    raw = os.environ.get("LABS_DBPEDIA_DIR", "").strip()
    if not raw:
        return fetch("dbpedia")
    folder = Path(raw).expanduser().resolve()
    missing = [n for n in ("train.csv", "test.csv", "classes.txt") if not (folder / n).is_file()]
    if missing:
        raise DataError(
            f"LABS_DBPEDIA_DIR={raw!r} lacks {', '.join(missing)}: point it at a folder with "
            f"train.csv, test.csv and classes.txt in the original DBpedia-14 format, or unset "
            f"it to download the full dataset"
        )
    return folder


def dbpedia_classes() -> list[str]:
    """The 14 class names, in label order 0..13."""
    path = dbpedia_dir() / "classes.txt"
    names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(names) != DBPEDIA_N_CLASSES:
        raise DataError(f"{path} must list {DBPEDIA_N_CLASSES} classes, one per line, found {len(names)}")
    return names


def _split_path(split: str) -> Path:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return dbpedia_dir() / f"{split}.csv"


def iter_dbpedia(split: str, path: Path | None = None) -> Iterator[DbpediaRow]:
    """Stream validated rows of a DBpedia CSV one at a time (never the whole file)."""
    path = Path(path) if path is not None else _split_path(split)
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise DataError(f"{path} line {reader.line_num}: malformed CSV ({exc})") from exc
            yield _parse_row(row, path, reader.line_num)


def _parse_row(row: list[str], path: Path, line: int) -> DbpediaRow:
    if len(row) != 3:
        raise DataError(
            f"{path} line {line}: expected 3 columns (class,title,content), got {len(row)}: "
            f"{_preview(row)}; fix the file or point LABS_DBPEDIA_DIR at the original data"
        )
    try:
        label = int(row[0])
    except ValueError:
        label = 0
    if not 1 <= label <= DBPEDIA_N_CLASSES:
        raise DataError(
            f"{path} line {line}: class must be an integer 1..{DBPEDIA_N_CLASSES}, got "
            f"{row[0]!r}; fix the file or point LABS_DBPEDIA_DIR at the original data"
        )
    return DbpediaRow(line, label - 1, row[1], row[2])


def _preview(row: list[str]) -> str:
    text = repr(row)
    return text if len(text) <= 80 else text[:77] + "..."


def load_dbpedia(split: str, n_per_class: int | None = None, seed: int = 0):
    """Load a DBpedia split as a DataFrame (label 0..13, title, content), in file order.

    Args:
        split: "train" or "test".
        n_per_class: keep at most this many rows of each class, drawn at random
            (stratified); None keeps every row.
        seed: seed of that draw.
    Returns:
        pandas DataFrame indexed by the CSV line number.
    Raises:
        DataError: the data is missing or a row is malformed (the message names the
            file and line).
    """
    import pandas as pd

    check_n_per_class(n_per_class)
    path = _split_path(split)
    keep = None
    if n_per_class is not None:
        labels = np.fromiter((r.label for r in iter_dbpedia(split, path)), dtype=np.int64)
        keep = stratified_sample(labels, n_per_class, seed)
    rows = [r for i, r in enumerate(iter_dbpedia(split, path)) if keep is None or keep[i]]
    frame = pd.DataFrame(rows, columns=DbpediaRow._fields).set_index("line")
    return frame


def check_n_per_class(n_per_class) -> None:
    """Raise ValueError unless n_per_class is None or a positive integer."""
    if n_per_class is not None and (isinstance(n_per_class, bool) or
                                    not isinstance(n_per_class, int) or n_per_class <= 0):
        raise ValueError(f"n_per_class must be a positive integer or None, got {n_per_class!r}")


def stratified_sample(labels, n_per_class: int, seed: int = 0) -> np.ndarray:
    """Boolean mask keeping at most `n_per_class` rows of each label, drawn with `seed`.

    The one stratified draw of the project: `load_dbpedia` and `text.sample_lines` both use
    it, so a Doc2Vec corpus and a DataFrame of the same arguments hold the same articles.
    """
    check_n_per_class(n_per_class)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    keep = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        keep[rng.choice(idx, size=min(n_per_class, len(idx)), replace=False)] = True
    return keep


def train_dev_split(labels, dev_fraction: float = 0.1, seed: int = 0):
    """Split indices 0..n-1 into stratified (train_idx, dev_idx), each sorted."""
    labels = np.asarray(labels)
    if not 0.0 < dev_fraction < 1.0:
        raise ValueError(f"dev_fraction must be strictly between 0 and 1, got {dev_fraction!r}")
    rng = np.random.default_rng(seed)
    dev = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n_dev = int(round(len(idx) * dev_fraction))
        dev.append(rng.choice(idx, size=n_dev, replace=False))
    dev_idx = np.sort(np.concatenate(dev)) if dev else np.array([], dtype=np.int64)
    train_idx = np.setdiff1d(np.arange(len(labels)), dev_idx)
    return train_idx, dev_idx
