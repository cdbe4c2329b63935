"""Weighted kappa loss against sklearn's Cohen's kappa; the registry against Keras/TF losses."""

import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import cohen_kappa_score

from helpers.training.losses import (
    LOSSES,
    WeightedKappaLoss,
    make_loss,
    weighted_sigmoid_cross_entropy,
)

K = 5
RNG = np.random.default_rng(0)


def _onehot(labels, k=K):
    return np.eye(k, dtype="float32")[labels]


def _kappa_of_soft(labels, probs, weights):
    """sklearn's weighted kappa where example i votes for class j with weight p_ij."""
    n, k = probs.shape
    y_true = np.repeat(labels, k)
    y_pred = np.tile(np.arange(k), n)
    return cohen_kappa_score(
        y_true, y_pred, weights=weights, sample_weight=probs.ravel(), labels=np.arange(k)
    )


@pytest.mark.parametrize("weightage", ["quadratic", "linear"])
def test_kappa_loss_on_hard_predictions_is_log_one_minus_sklearn_kappa(weightage):
    labels = RNG.integers(0, K, size=200)
    preds = np.where(RNG.random(200) < 0.6, labels, RNG.integers(0, K, size=200))
    loss = WeightedKappaLoss(K, weightage=weightage, epsilon=0.0)(_onehot(labels), _onehot(preds))
    kappa = cohen_kappa_score(labels, preds, weights=weightage)
    assert kappa > 0.3  # a meaningful agreement, not a degenerate case
    np.testing.assert_allclose(float(loss), np.log(1.0 - kappa), rtol=1e-5)


@pytest.mark.parametrize("weightage", ["quadratic", "linear"])
def test_kappa_loss_on_soft_predictions_matches_weighted_sklearn_kappa(weightage):
    labels = RNG.integers(0, K, size=64)
    logits = RNG.normal(size=(64, K)).astype("float32") + 3 * _onehot(labels)
    probs = tf.nn.softmax(logits).numpy().astype("float64")
    loss = WeightedKappaLoss(K, weightage=weightage, epsilon=1e-6, from_logits=True)(
        _onehot(labels), logits
    )
    kappa = _kappa_of_soft(labels, probs, weightage)
    np.testing.assert_allclose(float(loss), np.log(1.0 - kappa + 1e-6), rtol=1e-4)


def test_kappa_loss_rewards_agreement_and_has_a_gradient():
    labels = RNG.integers(0, K, size=50)
    y = _onehot(labels)
    logits = tf.Variable(RNG.normal(size=(50, K)).astype("float32"))
    loss_fn = WeightedKappaLoss(K, from_logits=True)
    with tf.GradientTape() as tape:
        before = loss_fn(y, logits)
    logits.assign_sub(10.0 * tape.gradient(before, logits))
    assert float(loss_fn(y, logits)) < float(before)
    assert float(loss_fn(y, 10 * y)) < float(loss_fn(y, -10 * y))


def test_kappa_loss_rejects_bad_settings():
    with pytest.raises(ValueError, match="weightage must be 'linear' or 'quadratic', got 'cubic'"):
        WeightedKappaLoss(K, weightage="cubic")
    with pytest.raises(ValueError, match="num_classes must be >= 2, got 1"):
        WeightedKappaLoss(1)


@pytest.mark.parametrize("pos_weight", [0.5, 2.0])
def test_weighted_cross_entropy_matches_its_formula(pos_weight):
    y = _onehot(RNG.integers(0, K, size=20))
    z = RNG.normal(size=(20, K)).astype("float32")
    sig = 1 / (1 + np.exp(-z.astype("float64")))
    expected = np.mean(-(pos_weight * y * np.log(sig) + (1 - y) * np.log(1 - sig)))
    got = float(weighted_sigmoid_cross_entropy(tf.constant(y), tf.constant(z), pos_weight))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    with pytest.raises(ValueError, match="pos_weight must be > 0, got 0"):
        weighted_sigmoid_cross_entropy(y, tf.constant(z), 0)


def test_registry_losses_match_tf_nn_references():
    labels = RNG.integers(0, K, size=30).astype("int32")
    z = tf.constant(RNG.normal(size=(30, K)).astype("float32"))
    y = tf.one_hot(labels, K)
    refs = {
        "softmax_ce": tf.nn.softmax_cross_entropy_with_logits(y, z),
        "sparse_softmax_ce": tf.nn.sparse_softmax_cross_entropy_with_logits(labels, z),
        "sigmoid_ce": tf.nn.sigmoid_cross_entropy_with_logits(y, z),
    }
    p = tf.sigmoid(z)
    p_t = y * p + (1 - y) * (1 - p)
    alpha_t = y * 0.25 + (1 - y) * 0.75  # TFA's sigmoid_focal_crossentropy, alpha .25 gamma 2
    refs["sigmoid_focal_ce"] = (
        alpha_t * (1 - p_t) ** 2 * tf.nn.sigmoid_cross_entropy_with_logits(y, z)
    )
    for name, ref in refs.items():
        np.testing.assert_allclose(
            float(make_loss(name, K)(labels, z)),
            float(tf.reduce_mean(ref)),
            rtol=1e-5,
            err_msg=name,
        )
    for name in LOSSES:
        assert np.isfinite(float(make_loss(name, K)(labels, z)))
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        make_loss("hinge")
