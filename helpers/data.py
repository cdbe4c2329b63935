"""Dataset registry, verified downloads, and loaders for MNIST and DBpedia-14."""
from __future__ import annotations

import csv
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from helpers import config

CHUNK = 1 << 20


@dataclass(frozen=True)
class Dataset:
    """One downloadable file: where it lives, what it must hash to, and its terms."""

    name: str
    filename: str  # name in the cache and in a mirror
    url: str
    sha256: str | None  # None when only the archive's members have published hashes
    size: int | None
    license: str
    members: dict[str, tuple[str, int]] = field(default_factory=dict)  # archive path -> (sha256, size)
    extract_to: str | None = None  # cache folder the members are extracted into


DATASETS = {
    "mnist": Dataset(
        name="mnist",
        filename="mnist.npz",
        url="https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz",
        sha256="731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1",
        size=11_490_434,
        license="CC BY-SA 3.0 (Yann LeCun and Corinna Cortes)",
    ),
    "dbpedia": Dataset(
        name="dbpedia",
        filename="dbpedia_csv.tgz",
        url="https://s3.amazonaws.com/fast-ai-nlp/dbpedia_csv.tgz",
        sha256=None,
        size=None,
        license="CC BY-SA 3.0 and GFDL (DBpedia; Zhang, Zhao & LeCun 2015)",
        members={
            "dbpedia_csv/train.csv": (
                "3fea0c8c6ae73d0911f9cf37ec68606d169c4edd9214c6443b035649a3fb38ce",
                174_148_970,
            ),
            "dbpedia_csv/test.csv": (
                "3d7b5fc00870e3446e322479af553629f55e313dd3b4249c08b68132d1230804",
                21_775_285,
            ),
            "dbpedia_csv/classes.txt": (
                "3390a11cf615554211a10dfcc4f807d25bc0293cbb6e62e913c16c2281e7a02c",
                146,
            ),
        },
        extract_to="dbpedia_csv",
    ),
}

DBPEDIA_N_CLASSES = 14


class DataError(RuntimeError):
    """A dataset could not be fetched, verified or parsed."""


class ChecksumError(DataError):
    """A file's sha256 is not the one the registry expects."""


# --------------------------------------------------------------------------- hashing

def sha256_of(path: Path) -> str:
    """Hash a file in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_cached(path: Path, expected: str, what: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        path.unlink()
        raise ChecksumError(
            f"{what} checksum mismatch (expected {expected}, got {actual}): "
            f"the corrupt file {path} was deleted; run again to download it afresh, "
            f"or set LABS_DATA_MIRROR to a source that holds the right file"
        )


# --------------------------------------------------------------------------- sources

def mirror() -> str | None:
    """LABS_DATA_MIRROR as given: an http(s) base URL or a local folder, or None."""
    raw = os.environ.get("LABS_DATA_MIRROR", "").strip()
    if not raw:
        return None
    if raw.startswith(("http://", "https://")):
        return raw.rstrip("/")
    folder = Path(raw.removeprefix("file://")).expanduser()
    if not folder.is_dir():
        raise DataError(
            f"LABS_DATA_MIRROR={raw!r} is neither an http(s) URL nor an existing folder: "
            f"point it at a folder or web server that holds the dataset files, or unset it"
        )
    return str(folder.resolve())


def source_of(ds: Dataset) -> str:
    """Where `ds` is fetched from: the mirror when one is set, else the canonical URL."""
    base = mirror()
    if base is None:
        return ds.url
    if base.startswith(("http://", "https://")):
        return f"{base}/{ds.filename}"
    return str(Path(base) / ds.filename)


def _open_source(src: str, timeout: float):
    """Open a URL or local file; return (stream, length or None)."""
    if src.startswith(("http://", "https://")):
        resp = urllib.request.urlopen(src, timeout=timeout)  # noqa: S310 - http(s) only
        length = resp.headers.get("Content-Length")
        return resp, int(length) if length else None
    path = Path(src)
    return open(path, "rb"), path.stat().st_size


def _unavailable(ds: Dataset, src: str, reason: object, dest: Path) -> DataError:
    what = f"{ds.url}"
    if ds.size:
        what += f" ({ds.size:,} bytes"
        what += f", sha256 {ds.sha256})" if ds.sha256 else ")"
    extra = ""
    if ds.name == "dbpedia":
        extra = (
            ", or set LABS_DBPEDIA_DIR to a folder holding train.csv, test.csv and "
            "classes.txt in the original format"
        )
    return DataError(
        f"could not fetch {ds.filename} from {src} ({reason}). If this machine is offline, "
        f"download {what} by hand and put it at {dest}, or set LABS_DATA_MIRROR to a folder "
        f"or http(s) URL that holds {ds.filename}{extra}"
    )


def download(ds: Dataset, dest: Path, timeout: float | None = None) -> Path:
    """Stream `ds` into `dest` via a temporary file, renamed only once it verifies."""
    from tqdm.auto import tqdm

    timeout = timeout or float(os.environ.get("LABS_DOWNLOAD_TIMEOUT", "60"))
    src = source_of(ds)
    try:
        stream, length = _open_source(src, timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _unavailable(ds, src, getattr(exc, "reason", exc), dest) from exc
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        digest, got = hashlib.sha256(), 0
        expected_len = length or ds.size
        with stream, os.fdopen(fd, "wb") as out, tqdm(
            total=expected_len, unit="B", unit_scale=True, desc=ds.filename, leave=False
        ) as bar:
            try:
                for chunk in iter(lambda: stream.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
            except (OSError, ValueError) as exc:  # IncompleteRead, reset, timeout
                raise DataError(
                    f"download of {ds.filename} from {src} broke off after {got:,} bytes "
                    f"({exc!r}); nothing was cached, run again to retry"
                ) from exc
        if expected_len is not None and got != expected_len:
            raise DataError(
                f"download of {ds.filename} from {src} was cut short: got {got:,} of "
                f"{expected_len:,} bytes; nothing was cached, run again to retry"
            )
        if ds.sha256 and digest.hexdigest() != ds.sha256:
            raise ChecksumError(
                f"{ds.filename} checksum mismatch (expected {ds.sha256}, got "
                f"{digest.hexdigest()}) for the file from {src}; nothing was cached. "
                f"Check LABS_DATA_MIRROR or download {ds.url} by hand to {dest}"
            )
        os.replace(tmp, dest)
        return dest
    finally:
        tmp.unlink(missing_ok=True)


def fetch(name_or_ds: str | Dataset) -> Path:
    """Return the verified cached file (or extracted folder) for a dataset, fetching it once.

    Args:
        name_or_ds: a name in DATASETS ("mnist", "dbpedia") or a Dataset.
    Returns:
        The path of the verified file, or of the folder its members were extracted to.
    Raises:
        DataError: it cannot be fetched (the message says what to download and where),
            or a file fails its checksum (ChecksumError; the bad file is removed).
    """
    ds = _dataset(name_or_ds)
    cache = config.data_dir()
    if ds.extract_to:
        return _fetch_archive(ds, cache)
    path = cache / ds.filename
    if path.exists():
        _check_cached(path, ds.sha256, ds.filename)
        return path
    return download(ds, path)


def _dataset(name_or_ds: str | Dataset) -> Dataset:
    if isinstance(name_or_ds, Dataset):
        return name_or_ds
    try:
        return DATASETS[name_or_ds]
    except KeyError:
        raise ValueError(
            f"unknown dataset {name_or_ds!r}: choose one of {sorted(DATASETS)}"
        ) from None


def _fetch_archive(ds: Dataset, cache: Path) -> Path:
    folder = cache / ds.extract_to
    wanted = {Path(m).name: sha for m, (sha, _) in ds.members.items()}
    if folder.is_dir() and all((folder / n).exists() for n in wanted):
        for n, sha in wanted.items():
            _check_cached(folder / n, sha, f"{ds.extract_to}/{n}")
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{ds.extract_to}.", dir=cache) as tmp:
        archive = download(ds, Path(tmp) / ds.filename)
        staged = Path(tmp) / "extracted"
        staged.mkdir()
        _extract_members(ds, archive, staged)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staged, folder)
    return folder


def _extract_members(ds: Dataset, archive: Path, into: Path) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member, (sha, _size) in ds.members.items():
                try:
                    src = tar.extractfile(member)
                except KeyError:
                    src = None
                if src is None:
                    raise DataError(
                        f"{ds.filename} has no file {member}: it is not the expected "
                        f"archive; check LABS_DATA_MIRROR or download {ds.url} by hand"
                    )
                out_path = into / Path(member).name
                digest = hashlib.sha256()
                with src, open(out_path, "wb") as out:
                    for chunk in iter(lambda: src.read(CHUNK), b""):
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != sha:
                    raise ChecksumError(
                        f"{member} checksum mismatch (expected {sha}, got "
                        f"{digest.hexdigest()}); nothing was cached. Check LABS_DATA_MIRROR "
                        f"or download {ds.url} by hand"
                    )
    except tarfile.TarError as exc:
        raise DataError(f"{ds.filename} is not a readable tar archive ({exc}); nothing was cached") from exc


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

    if n_per_class is not None and (not isinstance(n_per_class, int) or n_per_class <= 0):
        raise ValueError(f"n_per_class must be a positive integer or None, got {n_per_class!r}")
    path = _split_path(split)
    keep = None
    if n_per_class is not None:
        labels = np.fromiter((r.label for r in iter_dbpedia(split, path)), dtype=np.int64)
        keep = np.zeros(len(labels), dtype=bool)
        rng = np.random.default_rng(seed)
        for c in range(DBPEDIA_N_CLASSES):
            idx = np.flatnonzero(labels == c)
            keep[rng.choice(idx, size=min(n_per_class, len(idx)), replace=False)] = True
    rows = [r for i, r in enumerate(iter_dbpedia(split, path)) if keep is None or keep[i]]
    frame = pd.DataFrame(rows, columns=DbpediaRow._fields).set_index("line")
    return frame


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


def available() -> dict[str, str]:
    """Say, without downloading, where each dataset would come from."""
    out = {}
    cache = config.data_dir()
    out["mnist"] = (
        f"cached at {cache / 'mnist.npz'}" if (cache / "mnist.npz").exists()
        else f"not cached; will be fetched from {_safe_source(DATASETS['mnist'])}"
    )
    if os.environ.get("LABS_DBPEDIA_DIR", "").strip():
        out["dbpedia"] = f"LABS_DBPEDIA_DIR={os.environ['LABS_DBPEDIA_DIR']}"
    elif (cache / "dbpedia_csv" / "train.csv").exists():
        out["dbpedia"] = f"cached at {cache / 'dbpedia_csv'} (full DBpedia-14)"
    else:
        out["dbpedia"] = f"not cached; will be fetched from {_safe_source(DATASETS['dbpedia'])}"
    return out


def _safe_source(ds: Dataset) -> str:
    try:
        return source_of(ds)
    except DataError as exc:
        return f"nowhere: {exc}"
