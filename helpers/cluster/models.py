"""Named Keras model builders and per-worker data shards for cluster training."""
from __future__ import annotations

import numpy as np


def load_arrays(data: str, train_size: int | None, test_size: int | None, seed: int):
    """Return (x_train, y_train, x_test, y_test) as float32/int32, subsetted with a seed."""
    x_tr, y_tr, x_te, y_te, _ = load_part(data, train_size, test_size, seed)
    return x_tr, y_tr, x_te, y_te


def load_part(data: str, train_size: int | None, test_size: int | None, seed: int,
              shard: tuple[int, int] = (0, 1), images: tuple[str, ...] = ("train", "test")):
    """What one cluster process needs: (x_train, y_train, x_test, y_test, classes).

    shard=(i, n) keeps the i-th of n interleaved shards of the seeded training subset;
    `images` says which of x_train/x_test to return (the other is None). Every step that can
    shrink the data (subset, shard) runs on the uint8 images before the float32 conversion,
    so a process never holds a float32 copy of data it does not use. `classes` is counted
    on all labels, so every process builds the same model.
    """
    if data == "mnist":  # stream just the rows needed out of the compressed file
        from helpers.data import fetch, load_mnist_rows

        with np.load(fetch("mnist")) as f:
            y_tr, y_te = f["y_train"], f["y_test"]
        rows, scale = load_mnist_rows, 1 / 255.0
    else:
        with np.load(data) as f:
            x_all = {"train": f["x_train"], "test": f["x_test"]}
            y_tr, y_te = f["y_train"], f["y_test"]
        rows, scale = (lambda split, idx: x_all[split][idx]), 1.0
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y_tr))[: train_size or len(y_tr)]
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
        out *= np.float32(scale)  # in place: no second float32 copy
        return out

    return as_float(x_tr), y_tr[order].astype(np.int32), as_float(x_te), y_te.astype(np.int32), classes


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
