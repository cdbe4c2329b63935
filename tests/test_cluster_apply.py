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
