"""Our Keras 3 proximal optimizers against TF1's reference ones, run in graph mode."""

import numpy as np
import pytest
import tensorflow as tf

from helpers.training.optimizers import (
    OPTIMIZERS,
    ProximalAdagrad,
    ProximalGradientDescent,
    make_optimizer,
)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 5)).astype("float32")
Y = RNG.normal(size=(32, 3)).astype("float32")
W0 = RNG.normal(size=(5, 3)).astype("float32")
B0 = RNG.normal(size=(3,)).astype("float32") * 0.1
STEPS = 25


def _loss(w, b):
    return tf.reduce_mean(tf.square(tf.matmul(X, w) + b - Y))


def _reference(kind, lr, l1, l2, init_acc=0.1):
    """Run TF1's optimizer in a tf.compat.v1 Graph + Session; return final (w, b)."""
    graph = tf.compat.v1.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable(W0)
        b = tf.compat.v1.Variable(B0)
        if kind == "gd":
            opt = tf.compat.v1.train.ProximalGradientDescentOptimizer(
                lr, l1_regularization_strength=l1, l2_regularization_strength=l2
            )
        else:
            opt = tf.compat.v1.train.ProximalAdagradOptimizer(
                lr,
                initial_accumulator_value=init_acc,
                l1_regularization_strength=l1,
                l2_regularization_strength=l2,
            )
        train_op = opt.minimize(_loss(w, b), var_list=[w, b])
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train_op)
            return sess.run([w, b])


def _ours(opt):
    w, b = tf.Variable(W0), tf.Variable(B0)
    for _ in range(STEPS):
        with tf.GradientTape() as tape:
            loss = _loss(w, b)
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
    return w.numpy(), b.numpy()


CASES = [(0.1, 0.0, 0.0), (0.1, 0.05, 0.0), (0.1, 0.0, 0.5), (0.3, 0.2, 0.3)]


@pytest.mark.parametrize("lr,l1,l2", CASES)
def test_proximal_gd_matches_tf1(lr, l1, l2):
    ref = _reference("gd", lr, l1, l2)
    got = _ours(ProximalGradientDescent(lr, l1=l1, l2=l2))
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lr,l1,l2", CASES)
@pytest.mark.parametrize("init_acc", [0.1, 1.0])
def test_proximal_adagrad_matches_tf1(lr, l1, l2, init_acc):
    ref = _reference("adagrad", lr, l1, l2, init_acc)
    got = _ours(ProximalAdagrad(lr, initial_accumulator_value=init_acc, l1=l1, l2=l2))
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_l1_makes_weights_exactly_zero():
    w, _ = _ours(ProximalGradientDescent(0.1, l1=0.5))
    assert np.sum(w == 0.0) > 0  # soft-thresholding gives exact zeros, unlike a penalty


def test_proximal_without_penalty_is_plain_gd():
    ref = _ours(tf.keras.optimizers.SGD(0.1))
    got = _ours(ProximalGradientDescent(0.1))
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def test_registry_builds_every_optimizer_and_it_descends():
    for name in OPTIMIZERS:
        w, b = tf.Variable(W0), tf.Variable(B0)
        before = float(_loss(w, b))
        opt = make_optimizer(name, 0.05 if name != "adadelta" else 1.0)
        for _ in range(20):
            with tf.GradientTape() as tape:
                loss = _loss(w, b)
            opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
        assert float(_loss(w, b)) < before, name


def test_registry_overrides_hyperparameters():
    opt = make_optimizer("momentum", 0.1, momentum=0.5)
    assert opt.momentum == 0.5
    assert make_optimizer("proximal_adagrad", 0.1, l1=0.2).l1 == 0.2


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="unknown optimizer 'sgdd'"):
        make_optimizer("sgdd", 0.1)
    with pytest.raises(ValueError, match="learning_rate must be > 0, got -1"):
        make_optimizer("adam", -1)
    with pytest.raises(ValueError, match=r"no hyperparameter\(s\) \['rho'\]"):
        make_optimizer("adam", 0.1, rho=0.9)
    with pytest.raises(ValueError, match="l1 regularization strength must be >= 0, got -0.1"):
        ProximalGradientDescent(0.1, l1=-0.1)
    with pytest.raises(ValueError, match="initial_accumulator_value must be > 0"):
        ProximalAdagrad(0.1, initial_accumulator_value=0.0)


def test_config_round_trips():
    opt = ProximalAdagrad(0.2, l1=0.1, l2=0.3, initial_accumulator_value=0.5)
    again = ProximalAdagrad.from_config(opt.get_config())
    assert (again.l1, again.l2, again.initial_accumulator_value) == (0.1, 0.3, 0.5)
