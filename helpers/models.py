"""The models the lessons train, the arrays they train on, and their test accuracy.

Used by notebook 03's training loop (train.py), notebook 04's MirroredStrategy children
(mirrored.py), the cluster engine's processes (cluster/node.py) and TF's own strategies
(cluster/strategies.py), so that all of them build the same LeNet from the same data.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Arrays(NamedTuple):
    """A model's training and test arrays: images float32, labels int32."""

    x_train: np.ndarray | None
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray
    classes: int  # counted on all the labels, so every process builds the same model


def load_arrays(data: str = "mnist", train_size: int | None = None, test_size: int | None = None,
                seed: int | None = 0, shard: tuple[int, int] = (0, 1),
                images: tuple[str, ...] = ("train", "test"), flat: bool = False) -> Arrays:
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
        from helpers.data import load_mnist_rows
        from helpers.downloads import fetch

        with np.load(fetch("mnist")) as f:
            y_tr, y_te = f["y_train"], f["y_test"]
        rows, scale = load_mnist_rows, 255
    else:
        with np.load(data) as f:
            x_all = {"train": f["x_train"], "test": f["x_test"]}
            y_tr, y_te = f["y_train"], f["y_test"]
        rows, scale = (lambda split, idx: x_all[split][idx]), 1
    order = np.arange(len(y_tr)) if seed is None else np.random.default_rng(seed).permutation(len(y_tr))
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

    return Arrays(as_float(x_tr), y_tr[order].astype(np.int32), as_float(x_te),
                  y_te.astype(np.int32), classes)


def build(name: str, input_shape: tuple, classes: int, seed: int):
    """Build the named Keras model with seeded initial weights."""
    import keras

    keras.utils.set_random_seed(seed)
    if name == "logreg":
        model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                                  keras.layers.Dense(classes)])
    elif name == "lenet":
        model = keras.Sequential([
            keras.Input(input_shape), keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(16, 5, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(120, activation="relu"),
            keras.layers.Dense(84, activation="relu"),
            keras.layers.Dense(classes),
        ])
    else:
        raise ValueError(f"unknown model {name!r}: use 'logreg' or 'lenet'")
    return model


def accuracy(model, x, y, batch: int = 250) -> float:
    """Fraction of examples whose arg-max logit is the label (batches of 250 keep the
    activations of a LeNet forward pass ~5 MB, so evaluating does not raise peak memory)."""
    hits = 0
    for i in range(0, len(x), batch):
        logits = np.asarray(model(x[i:i + batch], training=False))
        hits += int((logits.argmax(axis=1) == y[i:i + batch]).sum())
    return hits / len(x)


def accuracy_fn(model, x, y, batch: int = 250):
    """`accuracy` compiled once, for a process that scores the same test set many times.

    Returns a no-argument function giving the model's current accuracy on (x, y). The batch
    loop runs inside one tf.function call: the cluster's evaluator scores every checkpoint,
    and the eager loop cost it ~7x the CPU (logreg on 2,000 images: 10 ms against 1.4),
    CPU the workers it shares the cores with need. Traced here, not at the first checkpoint.
    """
    import tensorflow as tf

    xs, ys, n = tf.constant(x), tf.constant(y, tf.int64), len(x)

    @tf.function
    def hits(xs, ys):
        total = tf.constant(0, tf.int64)
        for i in tf.range(0, n, batch):
            guess = tf.argmax(model(xs[i:i + batch], training=False), axis=1)
            total += tf.reduce_sum(tf.cast(guess == ys[i:i + batch], tf.int64))
        return total

    hits.get_concrete_function(xs, ys)
    return lambda: int(hits(xs, ys)) / n
