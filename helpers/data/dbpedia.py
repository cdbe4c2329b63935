"""DBpedia-14 from the verified cache (see downloads.py): rows, samples, and a streaming corpus."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from helpers.data.downloads import DataError, fetch

DBPEDIA_N_CLASSES = 14


# --------------------------------------------------------------------------- MNIST


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
        raise DataError(
            f"{path} must list {DBPEDIA_N_CLASSES} classes, one per line, found {len(names)}"
        )
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
    if n_per_class is not None and (
        isinstance(n_per_class, bool) or not isinstance(n_per_class, int) or n_per_class <= 0
    ):
        raise ValueError(f"n_per_class must be a positive integer or None, got {n_per_class!r}")


def stratified_sample(labels, n_per_class: int, seed: int = 0) -> np.ndarray:
    """Boolean mask keeping at most `n_per_class` rows of each label, drawn with `seed`.

    The one stratified draw of the project: `load_dbpedia` and `sample_lines` both use
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


SPLITS = ("train", "dev", "test")


def tokenize(text: str) -> list[str]:
    """Lower-case a text and split it into words of 2..20 letters (gensim simple_preprocess)."""
    from gensim.utils import simple_preprocess  # gensim only where text is tokenised

    return simple_preprocess(text, min_len=2, max_len=20)


def sample_lines(split: str, n_per_class: int | None = None, seed: int = 0) -> np.ndarray:
    """CSV line numbers of a stratified sample of a split (all lines when n_per_class is None).

    Streams only the labels, as `load_dbpedia` would draw them.
    """
    check_n_per_class(n_per_class)  # before the file is read
    rows = [(r.line, r.label) for r in iter_dbpedia(split)]
    lines = np.array([line for line, _ in rows], dtype=np.int64)
    if n_per_class is None:
        return lines
    labels = np.array([label for _, label in rows], dtype=np.int64)
    return lines[stratified_sample(labels, n_per_class, seed)]


class DbpediaCorpus:
    """Tokenised articles of one split, re-read from the CSV on every pass.

    Each pass yields TaggedDocument(words, [k]) with k = 0, 1, ... in file order, so a
    Doc2Vec model's `dv[k]` is the k-th document. Only the line numbers to keep are held
    in memory, never the text.

    Args:
        split: "train" or "test".
        lines: CSV line numbers to keep (e.g. from `sample_lines`); None keeps all.
    """

    def __init__(self, split: str, lines=None):
        self.split = split
        self.lines = None if lines is None else np.unique(np.asarray(lines, dtype=np.int64))
        if self.lines is not None and len(self.lines) == 0:
            raise ValueError(
                f"lines selects no document of {split!r}: pass None or a non-empty list"
            )
        self._len = None if self.lines is None else len(self.lines)

    def rows(self):
        """Yield the selected DbpediaRow tuples, streaming the file.

        The file's lines come in increasing order and `self.lines` is sorted, so one index
        walks along both: the pass holds the int64 array of line numbers and nothing more
        (a Python set of them would take about ten times its bytes).
        """
        if self.lines is None:
            yield from iter_dbpedia(self.split)
            return
        wanted, n, i = self.lines, len(self.lines), 0
        for row in iter_dbpedia(self.split):
            while i < n and wanted[i] < row.line:
                i += 1
            if i < n and wanted[i] == row.line:
                yield row

    def __iter__(self):
        from gensim.models.doc2vec import TaggedDocument

        for k, row in enumerate(self.rows()):
            yield TaggedDocument(tokenize(row.content), [k])

    def __len__(self):
        if self._len is None:
            self._len = sum(1 for _ in self.rows())
        return self._len

    def labels(self) -> np.ndarray:
        """The labels 0..13 of the selected documents, in corpus order."""
        return np.fromiter((r.label for r in self.rows()), dtype=np.int64)

    def __repr__(self):
        return f"DbpediaCorpus({self.split!r}, {len(self)} documents)"
