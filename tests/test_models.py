"""The compiled test-set scorer agrees with the eager one, and follows the model's weights."""

import numpy as np

from helpers.training import models


def _data(n=1030):  # not a multiple of the batch of 250
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(n, 784)).astype("float32"),
        rng.integers(0, 10, size=n).astype("int32"),
    )


def test_accuracy_fn_matches_accuracy():
    x, y = _data()
    model = models.build("lenet", (784,), 10, seed=0)
    assert models.accuracy_fn(model, x, y)() == models.accuracy(model, x, y)


def test_accuracy_fn_sees_each_new_checkpoint():
    x, y = _data()
    model = models.build("logreg", (784,), 10, seed=0)
    score = models.accuracy_fn(model, x, y)
    for label in (3, 7):  # weights that always answer `label`, as a loaded checkpoint would
        kernel, bias = model.trainable_variables
        kernel.assign(np.zeros(kernel.shape, "float32"))
        bias.assign(np.eye(10, dtype="float32")[label])
        assert score() == (y == label).mean()
