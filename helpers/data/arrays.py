"""The arrays the lessons' models train on: MNIST or DBpedia features, as float32 and int32.

Used by notebook 03's training loop, notebook 04's MirroredStrategy children, the cluster
engine's processes and TF's own strategies, so that all of them read the same data.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from helpers.data.downloads import fetch
from helpers.data.mnist import load_mnist_rows


class Arrays(NamedTuple):
    """A model's training and test arrays: images float32, labels int32."""

    x_train: np.ndarray | None
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray
    classes: int  # counted on all the labels, so every process builds the same model


def load_arrays(
    data: str = "mnist",
    train_size: int | None = None,
    test_size: int | None = None,
    seed: int | None = 0,
    shard: tuple[int, int] = (0, 1),
    images: tuple[str, ...] = ("train", "test"),
    flat: bool = False,
) -> Arrays:
    """The one loader of training data for models: MNIST scaled to [0, 1], or a features file.

    Args:
        data: "mnist", or the path of an .npz with x_train, y_train, x_test, y_test (e.g.
            notebook 01's Doc2Vec features), used as they are.
        train_size, test_size: keep this many examples (None: all). The training subset is
            drawn with `seed` (None: the first train_size examples, in order); the test
            examples are always the first test_size.
        shard: (i, n) keeps the i-th of n interleaved shards of the training subset (one per
            cluster worker).
        images: which of x_train / x_test to load (the other is None).
        flat: images as vectors of 784 instead of 28 x 28.

    Every step that shrinks the data (subset, shard) runs on the uint8 images before the
    float32 conversion, and MNIST's rows are streamed out of the compressed file, so a process
    never holds a float32 copy of data it does not use.
    """
    if data == "mnist":
        with np.load(fetch("mnist")) as f:
            y_tr, y_te = f["y_train"], f["y_test"]
        rows, scale = load_mnist_rows, 255
    else:
        with np.load(data) as f:
            x_all = {"train": f["x_train"], "test": f["x_test"]}
            y_tr, y_te = f["y_train"], f["y_test"]
        rows, scale = (lambda split, idx: x_all[split][idx]), 1
    order = (
        np.arange(len(y_tr)) if seed is None else np.random.default_rng(seed).permutation(len(y_tr))
    )
    order = order[: train_size or len(y_tr)]
    y_te = y_te[: test_size or len(y_te)]
    classes = int(max(y_tr[order].max(), y_te.max())) + 1
    index, count = shard
    order = order[index::count]
    x_tr = rows("train", order) if "train" in images else None
    x_te = rows("test", np.arange(len(y_te))) if "test" in images else None
    rows = x_all = None  # a features file: its full arrays go now, only the subsets stay

    def as_float(x):
        if x is None:
            return None
        out = x.astype(np.float32)
        out /= np.float32(scale)  # in place: no second float32 copy; equal to x / 255.0
        return out.reshape(len(out), -1) if flat else out

    return Arrays(
        as_float(x_tr), y_tr[order].astype(np.int32), as_float(x_te), y_te.astype(np.int32), classes
    )
