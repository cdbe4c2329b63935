"""helpers.files: all-or-nothing writes (the target is complete or untouched, no temporary is
left), and a file's sha256."""

import hashlib
import json

import numpy as np
import pytest

from helpers import files


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_write_json_replaces_the_file_whole(tmp_path):
    path = tmp_path / "record.json"
    files.write_json(path, {"a": 1})
    files.write_json(path, {"a": 2}, indent=1)
    assert json.loads(path.read_text()) == {"a": 2}
    assert _leftovers(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "ckpt.npz"
    with files.atomic_path(path, ".npz") as tmp:
        np.savez(tmp, w=np.ones(3))
    with pytest.raises(RuntimeError, match="disk full"):
        with files.atomic_path(path, ".npz") as tmp:
            np.savez(tmp, w=np.zeros(3))
            raise RuntimeError("disk full")
    with np.load(path) as f:
        assert f["w"].tolist() == [1.0, 1.0, 1.0]
    assert _leftovers(tmp_path) == []


def test_a_folder_is_replaced_only_when_complete(tmp_path):
    folder = tmp_path / "features"
    with files.atomic_path(folder, directory=True) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(KeyboardInterrupt):
        with files.atomic_path(folder, directory=True) as tmp:
            (tmp / "a.txt").write_text("second, half done")
            raise KeyboardInterrupt
    assert (folder / "a.txt").read_text() == "first"
    with files.atomic_path(folder, directory=True) as tmp:
        (tmp / "b.txt").write_text("third")
    assert sorted(p.name for p in folder.iterdir()) == ["b.txt"]
    assert _leftovers(tmp_path) == []


def test_written_files_get_the_permissions_of_a_plain_write(tmp_path):
    import os

    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    files.write_json(tmp_path / "atomic.json", {})
    assert (os.stat(tmp_path / "atomic.json").st_mode & 0o777) == (os.stat(plain).st_mode & 0o777)


def test_sha256_of_hashes_a_file_larger_than_one_chunk_as_hashlib_does(tmp_path):
    data = np.random.default_rng(0).bytes(files.CHUNK * 2 + 7)
    (tmp_path / "blob").write_bytes(data)
    assert files.sha256_of(tmp_path / "blob") == hashlib.sha256(data).hexdigest()
