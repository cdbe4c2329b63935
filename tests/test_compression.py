"""Gradient compressors against NumPy references: float16 rounding, top-k selection and the
error-feedback invariant (what was not sent is sent later)."""

import re

import numpy as np
import pytest
import tensorflow as tf

from helpers.training import compression
from helpers.training.compression import Float16, Float32, TopK


def grads(seed):
    rng = np.random.default_rng(seed)
    return [
        tf.constant(rng.normal(size=(6, 5)).astype(np.float32)),
        tf.constant(rng.normal(size=(5,)).astype(np.float32)),
    ]


def test_float16_rounds_like_numpy_and_halves_the_bytes():
    g = grads(0)
    out = Float16()(g)
    for a, b in zip(out, g):
        np.testing.assert_array_equal(a.numpy(), b.numpy().astype(np.float16).astype(np.float32))
    assert Float16().bytes_for([(6, 5), (5,)]) == 70 and Float32().bytes_for([(6, 5), (5,)]) == 140


def test_top_k_sends_the_largest_entries_and_keeps_the_rest():
    g = grads(1)
    comp = TopK(0.2)
    sent = comp(g)
    for s, full in zip(sent, g):
        flat, k = full.numpy().ravel(), int(np.ceil(0.2 * full.numpy().size))
        keep = np.argsort(-np.abs(flat))[:k]
        expect = np.zeros_like(flat)
        expect[keep] = flat[keep]
        np.testing.assert_array_equal(s.numpy().ravel(), expect)
    for r, s, full in zip(comp.residual, sent, g):
        np.testing.assert_allclose(r.numpy() + s.numpy(), full.numpy())
    assert comp.bytes_for([(6, 5), (5,)]) == 8 * (6 + 1)


def test_top_k_error_feedback_loses_nothing_over_steps():
    comp = TopK(0.1)
    total_in = total_out = 0
    for seed in range(20):
        g = grads(seed)
        out = comp(g)
        total_in = total_in + np.concatenate([x.numpy().ravel() for x in g])
        total_out = total_out + np.concatenate([x.numpy().ravel() for x in out])
    residual = np.concatenate([r.numpy().ravel() for r in comp.residual])
    np.testing.assert_allclose(total_out + residual, total_in, atol=1e-5)


def test_bad_fraction_is_refused():
    with pytest.raises(ValueError, match=r"top-k fraction must be in \(0, 1\], got 0"):
        TopK(0)


@pytest.mark.parametrize("spec", [None, "float16", {"topk": 0.2}])
def test_the_wire_format_is_what_bytes_for_counts_and_decodes_back(spec):
    comp = compression.from_spec(spec)
    g = grads(2)
    shapes = [tuple(x.shape) for x in g]
    wire = comp.encode(g)
    assert [(w.dtype.name, tuple(w.shape)) for w in wire] == comp.wire_spec(shapes)
    assert sum(w.numpy().nbytes for w in wire) == comp.bytes_for(shapes)
    comp.feedback = False  # compare one encode + decode with the one-process call
    for a, b in zip(comp.decode(wire, shapes), comp(g)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize(
    "spec,message",
    [
        ("int8", "compress must be None, 'float16' or {'topk': fraction}, got 'int8'"),
        ({"topk": 1.5}, "top-k fraction must be in (0, 1], got 1.5"),
        ({"top_k": 0.1}, "compress must be None"),
    ],
)
def test_unknown_compression_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        compression.from_spec(spec)
