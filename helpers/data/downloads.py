"""The dataset registry and verified downloads into the cache (`data/`), all or nothing.

`fetch("mnist")` returns the cached file, downloading it once from its canonical URL or from
LABS_DATA_MIRROR (an http(s) base URL, or a local folder); every file is checked against the
sha256 in the registry, streamed to a temporary file, and renamed into the cache only once it
verifies, so an interrupted or corrupt download leaves nothing behind. An archive (DBpedia's
tgz, whose publisher lists hashes of its members only) is extracted member by member into a
temporary folder that replaces the cache folder once every member verifies.

Our own code, not pooch's: pooch (registry, progress bar, untar) was weighed against it and
lacks three things this project tests. It has no local-folder mirror (its downloaders take
http, https, ftp, sftp and doi URLs only; CI and offline classrooms point LABS_DATA_MIRROR at a
folder). Its Untar extracts in place and trusts any member file that exists, so an interrupted
extraction leaves half a member that is then served as cached. And it keeps the 68 MB archive
next to its contents. What pooch would replace is the few dozen lines of HTTP streaming and hashing.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from helpers import config
from helpers.files import atomic_path, sha256_of

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
    members: dict[str, tuple[str, int]] = field(
        default_factory=dict
    )  # archive path -> (sha256, size)
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


class DataError(RuntimeError):
    """A dataset could not be fetched, verified or parsed."""


class ChecksumError(DataError):
    """A file's sha256 is not the one the registry expects."""


# --------------------------------------------------------------------------- hashing


_VERIFIED: dict[Path, tuple] = {}  # path -> (checksum, size, mtime, inode) it was verified with


def _check_cached(path: Path, expected: str, what: str) -> None:
    """Verify a cached file's checksum, once per process while the file stays the same (a
    cluster's node reads its dataset at every run)."""
    st = path.stat()
    seen = (expected, st.st_size, st.st_mtime_ns, st.st_ino)
    if _VERIFIED.get(path) == seen:
        return
    actual = sha256_of(path)
    if actual == expected:
        _VERIFIED[path] = seen
    else:
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


def download(
    ds: Dataset, dest: Path, timeout: float | None = None, put_at: Path | None = None
) -> Path:
    """Stream `ds` into `dest` via a temporary file, renamed only once it verifies.

    `put_at`: where the error message tells an offline user to put the file by hand, when
    that is not `dest` (an archive is downloaded into a temporary folder).
    """
    from tqdm.auto import tqdm

    timeout = timeout or float(os.environ.get("LABS_DOWNLOAD_TIMEOUT", "60"))
    src = source_of(ds)
    try:
        stream, length = _open_source(src, timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _unavailable(ds, src, getattr(exc, "reason", exc), put_at or dest) from exc
    with atomic_path(dest, ".part") as tmp:
        digest, got = hashlib.sha256(), 0
        expected_len = length or ds.size
        with (
            stream,
            open(tmp, "wb") as out,
            tqdm(
                total=expected_len, unit="B", unit_scale=True, desc=ds.filename, leave=False
            ) as bar,
        ):
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
    return dest


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
    by_hand = cache / ds.filename  # an archive a user downloaded by hand, as told offline
    with tempfile.TemporaryDirectory(prefix=f".{ds.extract_to}.", dir=cache) as tmp:
        if by_hand.is_file():  # its members are checked against their sha256 below
            archive = by_hand
        else:
            archive = download(ds, Path(tmp) / ds.filename, put_at=by_hand)
        with atomic_path(folder, directory=True) as staged:
            _extract_members(ds, archive, staged)
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
                    for chunk in iter(partial(src.read, CHUNK), b""):
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != sha:
                    raise ChecksumError(
                        f"{member} checksum mismatch (expected {sha}, got "
                        f"{digest.hexdigest()}); nothing was cached. Check LABS_DATA_MIRROR "
                        f"or download {ds.url} by hand"
                    )
    except tarfile.TarError as exc:
        raise DataError(
            f"{ds.filename} is not a readable tar archive ({exc}); nothing was cached"
        ) from exc


def cached_path(name: str) -> Path | None:
    """Where a single-file dataset ("mnist") is cached, if it is; nothing is fetched or
    verified (`fetch` verifies)."""
    path = config.data_dir() / DATASETS[name].filename
    return path if path.exists() else None


def available() -> dict[str, str]:
    """Say, without downloading, where each dataset would come from."""
    out = {}
    cache = config.data_dir()
    mnist = cached_path("mnist")
    out["mnist"] = (
        f"cached at {mnist}"
        if mnist
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
