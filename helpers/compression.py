"""Gradient compression for pushes: float16 and top-k sparsification with error feedback.

Each compressor turns a list of float32 gradient tensors into what the PS would apply after
decompressing, and says how many bytes the compressed push carries. They are TensorFlow
ops, so they run inside a worker's tf.function.
"""
from __future__ import annotations

import math


class Float32:
    """No compression: every gradient entry as a 4-byte float."""

    name = "float32"

    def __call__(self, grads):
        return list(grads)

    def bytes_for(self, shapes) -> int:
        """Payload of one push for tensors of these shapes."""
        return sum(4 * math.prod(s) for s in shapes)


class Float16:
    """Send gradients as float16: half the bytes, about 3 significant digits."""

    name = "float16"

    def __call__(self, grads):
        import tensorflow as tf

        return [tf.cast(tf.cast(g, tf.float16), tf.float32) for g in grads]

    def bytes_for(self, shapes) -> int:
        """Payload of one push for tensors of these shapes."""
        return sum(2 * math.prod(s) for s in shapes)


class TopK:
    """Send only the largest `fraction` of gradient entries (value + int32 index) per tensor.

    The entries not sent are kept in a residual and added to the next gradient (error
    feedback), so nothing is lost, only delayed.
    """

    def __init__(self, fraction: float):
        if not 0 < fraction <= 1:
            raise ValueError(f"top-k fraction must be in (0, 1], got {fraction!r}")
        self.fraction = fraction
        self.name = f"top-{fraction:.0%}"
        self.residual = None

    def _k(self, size: int) -> int:
        return max(1, math.ceil(self.fraction * size))

    def __call__(self, grads):
        import tensorflow as tf

        if self.residual is None:
            self.residual = [tf.Variable(tf.zeros_like(g), trainable=False) for g in grads]
        out = []
        for g, r in zip(grads, self.residual):
            full = tf.reshape(g + r, [-1])
            _, idx = tf.math.top_k(tf.abs(full), k=self._k(int(full.shape[0])))
            sent = tf.scatter_nd(idx[:, None], tf.gather(full, idx), tf.shape(full))
            r.assign(tf.reshape(full - sent, tf.shape(g)))
            out.append(tf.reshape(sent, tf.shape(g)))
        return out

    def bytes_for(self, shapes) -> int:
        """Payload of one push for tensors of these shapes: 4-byte value + 4-byte index each."""
        return sum(8 * self._k(math.prod(s)) for s in shapes)
