"""Named Keras model builders and per-worker data shards for cluster training."""
from __future__ import annotations

import numpy as np


def load_arrays(data: str, train_size: int | None, test_size: int | None, seed: int):
    """Return (x_train, y_train, x_test, y_test) as float32/int32, subsetted with a seed."""
    if data == "mnist":
        from helpers.data import load_mnist

        (x_tr, y_tr), (x_te, y_te) = load_mnist()
        scale = 1 / 255.0
    else:
        with np.load(data) as f:
            x_tr, y_tr, x_te, y_te = (f[k] for k in ("x_train", "y_train", "x_test", "y_test"))
        scale = 1.0
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x_tr))[: train_size or len(x_tr)]
    x_te, y_te = x_te[: test_size or len(x_te)], y_te[: test_size or len(y_te)]
    # subset before converting: a float32 copy of all of MNIST would cost ~190 MB per process
    return (x_tr[order].astype(np.float32) * np.float32(scale), y_tr[order].astype(np.int32),
            x_te.astype(np.float32) * np.float32(scale), y_te.astype(np.int32))


def shard(x, y, index: int, count: int):
    """The index-th of `count` interleaved shards of (x, y)."""
    return x[index::count], y[index::count]


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


def accuracy(model, x, y, batch: int = 1000) -> float:
    """Fraction of examples whose arg-max logit is the label."""
    hits = 0
    for i in range(0, len(x), batch):
        logits = np.asarray(model(x[i:i + batch], training=False))
        hits += int((logits.argmax(axis=1) == y[i:i + batch]).sum())
    return hits / len(x)
