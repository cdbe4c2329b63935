"""The custom loop: it learns, follows batch schedules, and flags divergence."""

import keras
import numpy as np

from helpers import config
from helpers.training.loop import train_loop
from helpers.training.losses import make_loss
from helpers.training.models import accuracy
from helpers.training.optimizers import make_optimizer


def _blobs(n=600, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n).astype("int32")
    x = (rng.normal(size=(n, 4)) + 3 * np.eye(3, 4)[y]).astype("float32")
    return x, y


def _model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])


def test_training_learns_and_records_growing_batches():
    config.set_seed(0)
    data = _blobs()
    model = _model()
    hist = train_loop(
        model,
        make_optimizer("adam", 0.05),
        make_loss("sparse_softmax_ce", 3),
        data,
        _blobs(200, 1),
        epochs=3,
        batch_size=(20, 10),
    )
    assert hist["batch_sizes"] == [20, 30, 40]
    assert hist["steps"] == 30 + 20 + 15
    assert hist["eval_acc"][-1] > 0.9 and not hist["diverged"]
    held_out = _blobs(200, 1)
    assert hist["eval_acc"][-1] == accuracy(model, *held_out)
    # the predictions behind the last score, one per held-out example
    assert np.mean(np.array(hist["eval_pred"]) == held_out[1]) == hist["eval_acc"][-1]
    assert len(hist["epoch_seconds"]) == 3 and sum(hist["epoch_seconds"]) <= hist["seconds"]


def test_huge_learning_rate_is_flagged_as_diverged():
    config.set_seed(0)
    x, y = _blobs()
    x = x * 1e6
    hist = train_loop(
        _model(),
        make_optimizer("gd", 1e6),
        make_loss("sparse_softmax_ce", 3),
        (x, y),
        (x, y),
        epochs=3,
        batch_size=50,
    )
    assert hist["diverged"] and hist["eval_pred"] == []
