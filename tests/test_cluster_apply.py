"""The PS's update rule (update.apply_update) against NumPy: SGD and momentum, one push or a
weighted sum of several, on local TF variables (no cluster needed)."""

import numpy as np
import pytest
import tensorflow as tf

from helpers.cluster.update import apply_update
from helpers.cluster.wire import pack_by_dtype, unpack


def handles(values):
    return [tf.Variable(v) for v in values]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_apply_update_matches_the_formula_over_several_steps(momentum):
    rng = np.random.default_rng(0)
    w = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)]
    params, version = handles(w), tf.Variable(tf.constant(0, tf.int64))
    velocity = handles([np.zeros_like(x) for x in w])
    ref, ref_v = [x.copy() for x in w], [np.zeros_like(x) for x in w]
    for step in range(5):
        pushes = [[rng.normal(size=x.shape).astype(np.float32) for x in w] for _ in range(3)]
        weights = [1.0] if step == 0 else [0.5, 0.3, 0.2]
        pushes = pushes[: len(weights)]
        apply_update(
            [p.handle for p in params],
            version.handle,
            [[tf.constant(g) for g in push] for push in pushes],
            weights,
            0.1,
            momentum,
            [v.handle for v in velocity],
        )
        for i in range(len(w)):
            g = sum(wt * push[i] for wt, push in zip(weights, pushes))
            ref_v[i] = momentum * ref_v[i] + g if momentum else g
            ref[i] = ref[i] - 0.1 * ref_v[i]
    for p, r in zip(params, ref):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-5, atol=1e-6)
    assert int(version.numpy()) == 5


def test_pack_and_unpack_round_trip_mixed_dtypes():
    tensors = [
        tf.constant([1, -2, 2**40, -(2**62)], tf.int64),
        tf.ones((2, 3)),
        tf.constant([7, -8], tf.int32),
        tf.fill((5,), 2.5),
        tf.constant([0.5, 3], tf.float16),
        tf.constant(-3, tf.int64),
        tf.constant([1.7e9 + 1e-6, float("nan"), -0.0], tf.float64),  # time stamps
    ]
    shapes = [tuple(t.shape) for t in tensors]
    packed = pack_by_dtype(tensors)
    # integers and float64 travel as float32 words beside the floats: one transfer, plus one
    # for float16
    assert [idx for idx, _, _ in packed] == [[0, 1, 2, 3, 5, 6], [4]]
    assert packed[0][2].dtype == tf.float32 and packed[0][2].shape == (8 + 6 + 2 + 5 + 2 + 6,)
    for a, b in zip(unpack(packed, shapes), tensors):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.numpy().tobytes() == b.numpy().tobytes()  # bit for bit: NaN's, -0.0's


def test_apply_update_orders_the_version_after_the_writes_in_a_tf_function():
    w = tf.Variable(tf.ones((3,))), tf.Variable(tf.zeros((2,)))
    version = tf.Variable(tf.constant(0, tf.int64))

    @tf.function
    def apply_and_read(lr):
        bumped = apply_update(
            [v.handle for v in w], version.handle, [[tf.ones((3,)), tf.ones((2,))]], [1.0], lr
        )
        with tf.control_dependencies([bumped]):
            return version.read_value(), [v.read_value() for v in w]

    v, values = apply_and_read(tf.constant(0.5))
    assert int(v) == 1
    np.testing.assert_allclose(values[0].numpy(), [0.5] * 3)
    np.testing.assert_allclose(values[1].numpy(), [-0.5] * 2)


@pytest.mark.parametrize("n_push", [1, 2])
def test_an_async_worker_applies_the_mean_of_its_gradients_then_starts_a_new_sum(n_push):
    """The worker's step function, with this process's CPU as the PS's device: each push
    applies -lr times the mean of the gradients since the last push (n_push = 1: the
    gradient itself), each on the parameters pulled in its step, and the next sum starts
    from zero (Downpour, n_push = 2: a sum not zeroed would push the first pair again)."""
    import keras

    from helpers.cluster import protocol, wire
    from helpers.cluster.worker import WorkerLoop
    from helpers.training import models

    here = tf.Variable(0.0).device  # this process's CPU, as the PS's device
    cfg = protocol.RunConfig(
        workers=1, n_push=n_push, lr=0.5, batch_size=8, run_id=f"apply-n{n_push}", worker_ids=[0]
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * 8, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=4 * 8)
    model = models.build("logreg", (6,), 3, 0)
    start = [v.numpy() for v in model.trainable_variables]
    res = wire.declare(tf, [here], cfg, [w.shape for w in start])
    for h, w in zip(res.vars, start):
        tf.raw_ops.AssignVariableOp(resource=h, value=tf.constant(w))
    for h, w in zip(res.velocity, start):
        tf.raw_ops.AssignVariableOp(resource=h, value=tf.zeros(w.shape))
    tf.raw_ops.AssignVariableOp(resource=res.version, value=tf.constant(0, tf.int64))
    tf.raw_ops.QueueEnqueueManyV2(
        handle=res.tickets, components=[tf.range(4, dtype=tf.int64), tf.fill([4], 0.5)]
    )
    node = type("Node", (), {"task": 0, "ps_device": here})()
    loop = WorkerLoop(node, cfg, None, model, res, x, y)

    reference = models.build("logreg", (6,), 3, 0)  # the expected update, computed apart
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    expected, grads = [w.copy() for w in start], []
    for s in range(4):
        xb, yb = x[8 * s : 8 * s + 8], y[8 * s : 8 * s + 8]
        push = (s + 1) % n_push == 0
        loop.step(xb, yb, tf.constant(s, tf.int64), True, push, False)
        for var, w in zip(reference.trainable_variables, expected):  # the step's pull
            var.assign(w)
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, reference(xb, training=True))
        grads.append([g.numpy() for g in tape.gradient(loss, reference.trainable_variables)])
        if push:
            mean = [sum(g[i] for g in grads) / n_push for i in range(len(start))]
            expected = [w - 0.5 * m for w, m in zip(expected, mean)]
            grads = []
            on_ps = [tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32) for h in res.vars]
            for got, want in zip(on_ps, expected):
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
            assert all(not a.numpy().any() for a in loop.acc)  # the next sum starts at zero
    assert int(tf.raw_ops.ReadVariableOp(resource=res.version, dtype=tf.int64)) == 4 // n_push
