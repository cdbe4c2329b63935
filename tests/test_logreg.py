"""Softmax regression, the SGD loop and the metrics table, against TF/Keras and scikit-learn."""

import numpy as np
import pytest
import tensorflow as tf
from keras.optimizers.schedules import ExponentialDecay

from helpers.training import logreg, schedules


def blobs(n=600, d=5, k=3, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, size=(k, d))
    y = rng.integers(0, k, size=n)
    return (centres[y] + rng.normal(size=(n, d))).astype(np.float32), y


@pytest.mark.parametrize(
    "y_true,y_pred,expected",
    [
        # class 0: P 1/2 R 1/2 F1 1/2; class 1: P 2/3 R 1 F1 4/5; class 2, never predicted: 0
        ([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], (3 / 5, (1 / 2 + 2 / 3) / 3, 1.5 / 3, 1.3 / 3)),
        # class 1 is only predicted, never true: it still counts, with 0 (macro over both)
        ([0, 0], [0, 1], (1 / 2, 1 / 2, 1 / 4, (2 / 3) / 2)),
    ],
)
def test_metrics_table_by_hand(y_true, y_pred, expected):
    ours = logreg.metrics_table(y_true, y_pred)
    got = (ours["accuracy"], ours["macro_precision"], ours["macro_recall"], ours["macro_f1"])
    assert got == pytest.approx(expected)


def test_metrics_table_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="same length|one length"):
        logreg.metrics_table([0, 1, 2], [0, 1])


def test_loss_is_keras_crossentropy_plus_l2_penalty():
    x, y = blobs(50)
    model = logreg.SoftmaxRegression(5, 3, l2=0.01)
    model.w.assign(tf.random.normal([5, 3], seed=1))
    model.b.assign([0.1, -0.2, 0.3])
    ce, total = model.losses(tf.constant(x), tf.constant(y))
    ref = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, x @ model.w + model.b)
    assert float(ce) == pytest.approx(float(ref), rel=1e-5)
    assert float(total) == pytest.approx(
        float(ref) + 0.01 * float(tf.reduce_sum(model.w**2)), rel=1e-5
    )


def test_one_sgd_step_equals_keras_sgd_step():
    x, y = blobs(32)
    ours = logreg.SoftmaxRegression(5, 3, l2=0.1)
    logreg.train(
        ours, {"train": (x, y)}, schedules.Constant(0.05), epochs=1, batch_size=32, progress=False
    )
    w, b = tf.Variable(tf.zeros([5, 3])), tf.Variable(tf.zeros([3]))
    with tf.GradientTape() as tape:
        logits = x @ w + b
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        ) + 0.1 * tf.reduce_sum(w**2)
    tf.keras.optimizers.SGD(0.05).apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
    np.testing.assert_allclose(ours.w.numpy(), w.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ours.b.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_train_learns_separable_blobs_and_records_history(tmp_path):
    x, y = blobs()
    model = logreg.SoftmaxRegression(5, 3, l2=1e-3)
    hist = logreg.train(
        model,
        {"train": (x[:500], y[:500]), "dev": (x[500:], y[500:])},
        ExponentialDecay(0.5, 10, 0.96),
        epochs=4,
        batch_size=50,
        log_dir=tmp_path / "tb",
        progress=False,
    )
    assert len(hist.step_lr) == 4 * 10
    assert hist.step_lr[0] == pytest.approx(0.5)
    assert hist.step_lr[-1] == pytest.approx(0.5 * 0.96 ** (39 / 10), rel=1e-5)
    assert set(hist.epoch) == {"train_loss", "train_acc", "dev_loss", "dev_acc"}
    assert len(hist.epoch["dev_acc"]) == 4
    assert hist.final("dev_acc") > 0.9
    assert hist.epoch["train_loss"][-1] < hist.epoch["train_loss"][0]
    logged = {}
    for path in (tmp_path / "tb").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name == "scalars"
                logged.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor)))
                )
    assert [s for s, _ in logged["dev/accuracy"]] == [1, 2, 3, 4]
    np.testing.assert_allclose([v for _, v in logged["dev/accuracy"]], hist.epoch["dev_acc"])
    assert logged["learning_rate"][0] == (0, pytest.approx(0.5))


def test_an_exploding_rate_is_recorded_not_raised():
    x, y = blobs()
    model = logreg.SoftmaxRegression(5, 3)
    hist = logreg.train(
        model,
        {"train": (x * 100, y)},
        ExponentialDecay(1.0, 1, 10.0),
        epochs=3,
        batch_size=100,
        progress=False,
    )
    assert (
        not np.all(np.isfinite(hist.epoch["train_loss"]))
        or hist.epoch["train_loss"][-1] > hist.epoch["train_loss"][0]
    )
    assert logreg.oscillation(hist.step_loss) > 0.3


def test_oscillation_counts_rises():
    assert logreg.oscillation([3, 2, 1, 0.5]) == 0
    assert logreg.oscillation([1, 2, 1, 2, 1]) == 0.5
    assert logreg.oscillation([1, np.nan, np.inf]) == 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(epochs=0, batch_size=10), "epochs must be a positive integer, got 0"),
        (dict(epochs=1, batch_size=0), "batch_size must be a positive integer, got 0"),
    ],
)
def test_train_refuses_bad_arguments(kwargs, message):
    x, y = blobs(20)
    with pytest.raises(ValueError, match=message):
        logreg.train(
            logreg.SoftmaxRegression(5, 3), {"train": (x, y)}, schedules.Constant(0.1), **kwargs
        )


def test_model_refuses_negative_l2():
    with pytest.raises(ValueError, match="l2 must be >= 0, got -1"):
        logreg.SoftmaxRegression(5, 3, l2=-1)


def test_sharpness_at_zero_weights_is_the_closed_form_hessians_largest_eigenvalue():
    # at W = 0, b = 0 every p(y | x) is 1/k: the Hessian of the mean cross-entropy over
    # theta = [W; b] is (X1' X1 / n) kron (I/k - 11'/k^2), X1 = [X, 1], plus 2 l2 on W only
    x, y = blobs(n=200, d=4, k=3)
    n, d, k, l2 = len(y), 4, 3, 0.05
    x1 = np.hstack([x, np.ones((n, 1), np.float32)]).astype(np.float64)
    hessian = np.kron(x1.T @ x1 / n, np.eye(k) / k - np.ones((k, k)) / k**2)
    hessian += np.diag(np.r_[np.full(d * k, 2 * l2), np.zeros(k)])  # W row-major, then b
    expected = np.linalg.eigvalsh(hessian).max()
    model = logreg.SoftmaxRegression(d, k, l2=l2)
    assert logreg.sharpness(model, x, y) == pytest.approx(expected, rel=1e-3)


def test_sharpness_of_weights_that_diverged_is_nan_and_history_keeps_each_epochs_weights():
    x, y = blobs()
    model = logreg.SoftmaxRegression(5, 3)
    h = logreg.train(
        model, {"train": (x, y)}, schedules.Constant(0.1), epochs=2, batch_size=50, progress=False
    )
    assert len(h.weights) == 2 and np.array_equal(h.weights[-1][0], model.w.numpy())
    assert logreg.sharpness(model, x, y) > 0
    model.w.assign(tf.fill(model.w.shape, np.inf))
    assert np.isnan(logreg.sharpness(model, x, y))
