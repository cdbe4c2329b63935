"""The models the lessons train, and their test accuracy.

Used by notebook 03's training loop (loop.py), notebook 04's MirroredStrategy children
(mirrored.py), the cluster engine's processes (cluster/node.py) and TF's own strategies
(cluster/strategies.py), so that all of them build the same LeNet (data: helpers.data.arrays).
"""

from __future__ import annotations

import numpy as np

MODELS = ("logreg", "lenet", "mlp")  # what build() makes; the cluster and TF strategies take these
MLP_WIDTH = 1024  # "mlp": two hidden layers this wide (1.86 M parameters on MNIST, 7.5 MB)


def build(name: str, input_shape: tuple, classes: int, seed: int):
    """Build the named Keras model with seeded initial weights."""
    import keras

    keras.utils.set_random_seed(seed)
    if name == "logreg":
        model = keras.Sequential(
            [keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(classes)]
        )
    elif name == "lenet":
        model = keras.Sequential(
            [
                keras.Input(input_shape),
                keras.layers.Reshape((28, 28, 1)),
                keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(16, 5, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(120, activation="relu"),
                keras.layers.Dense(84, activation="relu"),
                keras.layers.Dense(classes),
            ]
        )
    elif name == "mlp":  # wide and shallow: many bytes to move for little compute per byte
        model = keras.Sequential(
            [
                keras.Input(input_shape),
                keras.layers.Flatten(),
                keras.layers.Dense(MLP_WIDTH, activation="relu"),
                keras.layers.Dense(MLP_WIDTH, activation="relu"),
                keras.layers.Dense(classes),
            ]
        )
    else:
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(MODELS)}")
    return model


def predictions(model, x, batch: int = 250) -> np.ndarray:
    """The arg-max logit of every example, in batches (batches of 250 keep the activations of a
    LeNet forward pass ~5 MB, so evaluating does not raise peak memory)."""
    return np.concatenate(
        [
            np.asarray(model(x[i : i + batch], training=False)).argmax(axis=1)
            for i in range(0, len(x), batch)
        ]
    )


def accuracy(model, x, y, batch: int = 250) -> float:
    """Fraction of examples whose arg-max logit is the label."""
    return float(np.mean(predictions(model, x, batch) == np.asarray(y)))


def accuracy_fn(model, x, y, batch: int = 250):
    """`accuracy` compiled once, for a process that scores the same test set many times.

    Returns a no-argument function giving the model's current accuracy on (x, y). The batch
    loop runs inside one tf.function call: the cluster's evaluator scores every checkpoint,
    and an eager loop would take CPU from the workers it shares the cores with. Traced here,
    not at the first checkpoint.
    """
    import tensorflow as tf

    xs, ys, n = tf.constant(x), tf.constant(y, tf.int64), len(x)

    @tf.function
    def hits(xs, ys):
        total = tf.constant(0, tf.int64)
        for i in tf.range(0, n, batch):
            guess = tf.argmax(model(xs[i : i + batch], training=False), axis=1)
            total += tf.reduce_sum(tf.cast(guess == ys[i : i + batch], tf.int64))
        return total

    hits.get_concrete_function(xs, ys)
    return lambda: int(hits(xs, ys)) / n
