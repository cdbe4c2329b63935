"""MNIST from the verified cache (see downloads.py): the whole arrays, or only some rows."""

from __future__ import annotations

import numpy as np

from helpers.data.downloads import DataError, cached_path, fetch


def load_mnist():
    """Load MNIST as Keras does: ((x_train, y_train), (x_test, y_test)), uint8 arrays."""
    with np.load(fetch("mnist")) as f:
        return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])


_HELD: dict[str, np.ndarray] = {}  # split -> all its images, read only (see hold)


def hold() -> None:
    """Keep both splits' images in this process's memory, read only, if MNIST is already
    downloaded (nothing is fetched here). For a fork server: its children share these pages
    rather than each decompressing the rows it needs at every run."""
    if cached_path("mnist") is None:
        return
    with np.load(fetch("mnist")) as f:
        for split in ("train", "test"):
            images = f[f"x_{split}"]
            _check_images(split, images.shape, False, images.dtype)
            images.flags.writeable = False
            _HELD[split] = images


def _check_images(split: str, shape, fortran: bool, dtype) -> None:
    if fortran or dtype != np.uint8 or len(shape) != 3:
        raise DataError(f"unexpected MNIST array x_{split}: {shape} {dtype}; re-download it")


def _check_rows(rows: np.ndarray, count: int) -> None:
    if len(rows) and not (0 <= rows.min() and rows.max() < count):
        raise ValueError(f"rows must be in [0, {count}), got {rows.min()}..{rows.max()}")


def load_mnist_rows(split: str, rows) -> np.ndarray:
    """Only these rows of MNIST's images (uint8, shape (len(rows), 28, 28)), in this order.

    The images are streamed out of the compressed .npz in 1 MB chunks, so the whole split is
    never in memory at once: the cluster's processes each need a few thousand rows, and a full
    decompression would add the split's size to every process's peak memory. In a process
    forked from one that holds them (`hold`), the rows are copied out of the held split.
    """
    import zipfile

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rows = np.asarray(rows, dtype=np.int64)
    if split in _HELD:
        _check_rows(rows, len(_HELD[split]))
        return _HELD[split][rows]
    with zipfile.ZipFile(fetch("mnist")) as z, z.open(f"x_{split}.npy") as f:
        read_header = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }[np.lib.format.read_magic(f)]
        shape, fortran, dtype = read_header(f)
        _check_images(split, shape, fortran, dtype)
        _check_rows(rows, shape[0])
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
