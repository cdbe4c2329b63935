"""The data layer against real files and a real HTTP server on 127.0.0.1 (no mocks)."""

import dataclasses
import hashlib
import http.server
import io
import shutil
import socket
import tarfile
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers import files
from helpers.data import dbpedia, downloads, mnist

MNIST = downloads.DATASETS["mnist"]


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serve a folder; /short/<name> promises the whole file but sends only half of it."""

    def do_GET(self):  # noqa: N802 - http.server naming
        if self.path.startswith("/short/"):
            body = (Path(self.directory) / self.path.removeprefix("/short/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A real http.server on 127.0.0.1 serving tmp_path/www; yields (base_url, folder)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **kw: _Handler(*a, directory=str(root), **kw)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("LABS_DATA_DIR", str(folder))
    monkeypatch.delenv("LABS_DATA_MIRROR", raising=False)
    monkeypatch.delenv("LABS_DBPEDIA_DIR", raising=False)
    return folder


def leftovers(folder: Path) -> list[str]:
    """Anything a failed fetch left behind (temporary or partial files)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


# ----------------------------------------------------------------------------- mirrors


def test_mirror_as_folder(cache, shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    path = downloads.fetch("mnist")
    assert path == cache / "mnist.npz"
    assert files.sha256_of(path) == MNIST.sha256
    assert leftovers(cache) == ["mnist.npz"]


def test_mirror_as_url(cache, shared_data, server, monkeypatch):
    base, root = server
    shutil.copy(shared_data / "mnist.npz", root / "mnist.npz")
    monkeypatch.setenv("LABS_DATA_MIRROR", base + "/")
    (x_train, y_train), (x_test, y_test) = mnist.load_mnist()
    assert x_train.shape == (60000, 28, 28) and x_test.shape == (10000, 28, 28)
    assert x_train.dtype == np.uint8
    # Label counts as published for MNIST (shared/data/SOURCES.md).
    assert np.bincount(y_train).tolist() == [
        5923,
        6742,
        5958,
        6131,
        5842,
        5421,
        5918,
        6265,
        5851,
        5949,
    ]
    assert np.bincount(y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert leftovers(cache) == ["mnist.npz"]


def test_mnist_rows_stream_exactly_the_rows_asked_for(cache, shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    (x_train, _), (x_test, _) = mnist.load_mnist()
    rows = np.random.default_rng(0).permutation(60000)[:3000]
    rows = np.concatenate([rows, [rows[0], 59999, 0]])  # repeats and both ends, any order
    np.testing.assert_array_equal(mnist.load_mnist_rows("train", rows), x_train[rows])
    np.testing.assert_array_equal(mnist.load_mnist_rows("test", [9999, 3]), x_test[[9999, 3]])
    assert mnist.load_mnist_rows("test", []).shape == (0, 28, 28)
    with pytest.raises(ValueError, match=r"rows must be in \[0, 10000\), got 0..10000"):
        mnist.load_mnist_rows("test", [0, 10000])
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'dev'"):
        mnist.load_mnist_rows("dev", [0])


def test_held_mnist_gives_the_same_rows_and_errors_and_holds_nothing_not_downloaded(
    cache, shared_data, monkeypatch
):
    """A fork server holds both splits (`hold`); rows then come out of them, as streamed."""
    monkeypatch.setattr(mnist, "_HELD", {})
    mnist.hold()  # not downloaded here: nothing held, nothing fetched
    assert mnist._HELD == {} and leftovers(cache) == []
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    rows = np.concatenate([np.random.default_rng(1).permutation(60000)[:500], [59999, 0, 0]])
    streamed = mnist.load_mnist_rows("train", rows), mnist.load_mnist_rows("test", [9999, 3])
    mnist.hold()
    assert sorted(mnist._HELD) == ["test", "train"]
    assert not mnist._HELD["train"].flags.writeable  # shared with the children: read only
    held = mnist.load_mnist_rows("train", rows), mnist.load_mnist_rows("test", [9999, 3])
    for a, b in zip(streamed, held):
        np.testing.assert_array_equal(a, b)
        assert b.flags.writeable  # a copy of the rows, the caller's own
    with pytest.raises(ValueError, match=r"rows must be in \[0, 10000\), got 0..10000"):
        mnist.load_mnist_rows("test", [0, 10000])


def test_a_cached_file_is_hashed_once_per_process_until_it_changes(cache, shared_data, monkeypatch):
    hashed = []
    sha256_of = downloads.sha256_of
    monkeypatch.setattr(downloads, "sha256_of", lambda p: hashed.append(p) or sha256_of(p))
    cache.mkdir()
    shutil.copy(shared_data / "mnist.npz", cache / "mnist.npz")
    downloads.fetch("mnist")
    downloads.fetch("mnist")  # verified already: not read again
    assert hashed == [cache / "mnist.npz"]
    corrupt = bytearray((cache / "mnist.npz").read_bytes())
    corrupt[-10] ^= 0x01
    (cache / "mnist.npz").write_bytes(corrupt)  # changed since: hashed again, and refused
    with pytest.raises(downloads.ChecksumError):
        downloads.fetch("mnist")
    assert len(hashed) == 2 and leftovers(cache) == []


def test_mirror_that_is_neither_url_nor_folder_is_refused(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_DATA_MIRROR", str(tmp_path / "no-such-folder"))
    with pytest.raises(dbpedia.DataError, match="neither an http.s. URL nor an existing folder"):
        downloads.fetch("mnist")


# ----------------------------------------------------------------------------- failures


def test_download_with_wrong_checksum_leaves_nothing(cache, shared_data, server, monkeypatch):
    base, root = server
    corrupt = bytearray((shared_data / "mnist.npz").read_bytes())
    corrupt[1000] ^= 0xFF
    (root / "mnist.npz").write_bytes(corrupt)
    monkeypatch.setenv("LABS_DATA_MIRROR", base)
    actual = hashlib.sha256(corrupt).hexdigest()
    with pytest.raises(downloads.ChecksumError) as err:
        downloads.fetch("mnist")
    assert MNIST.sha256 in str(err.value) and actual in str(err.value)
    assert "LABS_DATA_MIRROR" in str(err.value)
    assert leftovers(cache) == []


def test_corrupt_cached_file_is_rehashed_named_and_removed(cache, shared_data):
    cache.mkdir()
    corrupt = bytearray((shared_data / "mnist.npz").read_bytes())
    corrupt[-10] ^= 0x01
    (cache / "mnist.npz").write_bytes(corrupt)
    with pytest.raises(downloads.ChecksumError) as err:
        downloads.fetch("mnist")
    msg = str(err.value)
    assert MNIST.sha256 in msg and hashlib.sha256(corrupt).hexdigest() in msg
    assert "run again" in msg
    assert leftovers(cache) == []


def test_download_cut_short_by_server_leaves_nothing(cache, shared_data, server, monkeypatch):
    base, root = server
    shutil.copy(shared_data / "mnist.npz", root / "mnist.npz")
    monkeypatch.setenv("LABS_DATA_MIRROR", base + "/short")
    with pytest.raises(dbpedia.DataError, match="cut short|broke off"):
        downloads.fetch("mnist")
    assert leftovers(cache) == []


def test_offline_with_empty_cache_says_what_to_download_and_where(cache):
    offline = dataclasses.replace(MNIST, url=f"http://127.0.0.1:{closed_port()}/mnist.npz")
    with pytest.raises(dbpedia.DataError) as err:
        downloads.fetch(offline)
    msg = str(err.value)
    assert offline.url in msg  # what to download
    assert str(cache / "mnist.npz") in msg  # where to put it
    assert MNIST.sha256 in msg and "11,490,434 bytes" in msg
    assert "LABS_DATA_MIRROR" in msg
    assert leftovers(cache) == []


def test_unknown_dataset_name_is_refused(cache):
    with pytest.raises(ValueError, match=r"unknown dataset 'cifar'.*mnist"):
        downloads.fetch("cifar")


# ----------------------------------------------------------------------------- archives


def _tgz_of(folder: Path, members: list[str], out: Path) -> None:
    with tarfile.open(out, "w:gz") as tar:
        for name in members:
            tar.add(folder / name, arcname=f"dbpedia_csv/{name}")


def _archive_dataset(folder: Path) -> downloads.Dataset:
    members = {
        f"dbpedia_csv/{n}": (files.sha256_of(folder / n), (folder / n).stat().st_size)
        for n in ("train.csv", "test.csv", "classes.txt")
    }
    return dataclasses.replace(
        downloads.DATASETS["dbpedia"], members=members, url="http://127.0.0.1:9/unused.tgz"
    )


def test_archive_members_are_verified_and_extracted(cache, shared_data, server, monkeypatch):
    base, root = server
    subset = shared_data / "dbpedia_subset"
    _tgz_of(subset, ["train.csv", "test.csv", "classes.txt"], root / "dbpedia_csv.tgz")
    monkeypatch.setenv("LABS_DATA_MIRROR", base)
    folder = downloads.fetch(_archive_dataset(subset))
    assert folder == cache / "dbpedia_csv"
    assert sorted(p.name for p in folder.iterdir()) == ["classes.txt", "test.csv", "train.csv"]
    assert leftovers(cache) == [
        "dbpedia_csv",
        "dbpedia_csv/classes.txt",
        "dbpedia_csv/test.csv",
        "dbpedia_csv/train.csv",
    ]
    assert downloads.fetch(_archive_dataset(subset)) == folder  # cached: re-hashed, not fetched


def test_archive_with_a_bad_member_caches_nothing(
    cache, shared_data, server, tmp_path, monkeypatch
):
    base, root = server
    subset = shared_data / "dbpedia_subset"
    altered = tmp_path / "altered"
    shutil.copytree(subset, altered)
    (altered / "test.csv").chmod(0o644)
    with open(altered / "test.csv", "a", encoding="utf-8") as f:
        f.write('1,"","an extra row"\n')
    _tgz_of(altered, ["train.csv", "test.csv", "classes.txt"], root / "dbpedia_csv.tgz")
    monkeypatch.setenv("LABS_DATA_MIRROR", base)
    with pytest.raises(downloads.ChecksumError, match="dbpedia_csv/test.csv checksum mismatch"):
        downloads.fetch(_archive_dataset(subset))
    assert leftovers(cache) == []


def test_offline_archive_is_taken_from_where_the_error_says(cache, shared_data, tmp_path):
    subset = shared_data / "dbpedia_subset"
    offline = dataclasses.replace(
        _archive_dataset(subset), url=f"http://127.0.0.1:{closed_port()}/dbpedia_csv.tgz"
    )
    with pytest.raises(dbpedia.DataError) as err:
        downloads.fetch(offline)
    assert f"put it at {cache / 'dbpedia_csv.tgz'}," in str(err.value)  # not a temporary folder
    assert leftovers(cache) == []
    _tgz_of(subset, ["train.csv", "test.csv", "classes.txt"], cache / "dbpedia_csv.tgz")
    folder = downloads.fetch(offline)  # still offline: the archive put there by hand is used
    assert sorted(p.name for p in folder.iterdir()) == ["classes.txt", "test.csv", "train.csv"]


# ----------------------------------------------------------------------------- DBpedia CSV


@pytest.fixture
def dbpedia_dir(tmp_path, monkeypatch, shared_data):
    folder = tmp_path / "dbp"
    folder.mkdir()
    shutil.copy(shared_data / "dbpedia_subset" / "classes.txt", folder / "classes.txt")
    (folder / "test.csv").write_text('1,"","a company"\n', encoding="utf-8")
    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(folder))
    return folder


@pytest.mark.parametrize(
    "bad_line,match",
    [
        ('3,"only two columns"', r"line 3: expected 3 columns \(class,title,content\), got 2"),
        ('15,"t","class out of range"', r"line 3: class must be an integer 1\.\.14, got '15'"),
        ('x,"t","class not a number"', r"line 3: class must be an integer 1\.\.14, got 'x'"),
        ('0,"t","class zero"', r"line 3: class must be an integer 1\.\.14, got '0'"),
        ('2,"t","c","one column too many"', r"line 3: expected 3 columns .*got 4"),
    ],
)
def test_malformed_rows_name_file_and_line(dbpedia_dir, bad_line, match):
    rows = ['1,"Acme","A company."', '2,"","A school, with ""quotes""."', bad_line, '3,"","ok"']
    (dbpedia_dir / "train.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(dbpedia.DataError, match=match) as err:
        dbpedia.load_dbpedia("train")
    assert str(dbpedia_dir / "train.csv") in str(err.value)


def test_quoted_fields_are_parsed_like_the_original_format(dbpedia_dir):
    (dbpedia_dir / "train.csv").write_text('1,"Acme","A ""big"", old company."\n', encoding="utf-8")
    frame = dbpedia.load_dbpedia("train")
    assert frame.loc[1].tolist() == [0, "Acme", 'A "big", old company.']


def test_dbpedia_dir_missing_files_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(tmp_path))
    (tmp_path / "classes.txt").write_text("A\n")
    with pytest.raises(dbpedia.DataError, match="lacks train.csv, test.csv"):
        dbpedia.load_dbpedia("train")


def test_bad_split_and_sample_size_are_refused(shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'dev'"):
        dbpedia.load_dbpedia("dev")
    with pytest.raises(ValueError, match="n_per_class must be a positive integer"):
        dbpedia.load_dbpedia("train", n_per_class=0)


def test_real_subset_loads_with_published_counts(shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
    train = dbpedia.load_dbpedia("train")
    # Per-class counts as published in shared/data/SOURCES.md.
    assert np.bincount(train.label).tolist() == [
        1095,
        1077,
        1111,
        1080,
        1017,
        1148,
        1095,
        1091,
        1057,
        1092,
        1158,
        1158,
        1119,
        1049,
    ]
    assert dbpedia.dbpedia_classes()[0] == "Company" and len(dbpedia.dbpedia_classes()) == 14
    assert sum(1 for _ in dbpedia.iter_dbpedia("test")) == 9193


def test_stratified_sample_is_per_class_and_seeded(shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
    a = dbpedia.load_dbpedia("test", n_per_class=40, seed=1)
    assert Counter(a.label) == {c: 40 for c in range(14)}
    assert a.index.is_monotonic_increasing  # file order kept
    assert a.index.equals(dbpedia.load_dbpedia("test", n_per_class=40, seed=1).index)
    assert not a.index.equals(dbpedia.load_dbpedia("test", n_per_class=40, seed=2).index)
    full = dbpedia.load_dbpedia("test")
    assert (full.loc[a.index] == a).all().all()  # rows are the file's own rows


def test_train_dev_split_is_stratified_disjoint_and_complete():
    labels = np.repeat(np.arange(5), [100, 50, 200, 30, 20])
    train, dev = dbpedia.train_dev_split(labels, dev_fraction=0.2, seed=3)
    assert np.intersect1d(train, dev).size == 0
    assert np.union1d(train, dev).tolist() == list(range(len(labels)))
    assert np.bincount(labels[dev]).tolist() == [20, 10, 40, 6, 4]
    with pytest.raises(ValueError, match="dev_fraction must be strictly between 0 and 1, got 1.5"):
        dbpedia.train_dev_split(labels, dev_fraction=1.5)


def test_cut_short_archive_reader_is_not_confused_with_tar(tmp_path):
    # A truncated tgz is reported as unreadable, not extracted in part.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        payload = b"x" * 100_000
        info = tarfile.TarInfo("dbpedia_csv/train.csv")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    broken = tmp_path / "broken.tgz"
    broken.write_bytes(buf.getvalue()[:200])
    ds = downloads.DATASETS["dbpedia"]
    into = tmp_path / "out"
    into.mkdir()
    with pytest.raises(dbpedia.DataError):
        downloads._extract_members(ds, broken, into)
