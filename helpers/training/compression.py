"""Gradient compression for pushes: float16 and top-k sparsification with error feedback.

A compressor has a *wire format*: `encode` turns float32 gradient tensors into the tensors a
worker actually sends (float16 values; or top-k values plus int32 indices), `decode` turns
them back into dense float32 gradients on the PS, and `wire_spec` gives their dtypes and
shapes, so the PS's gradient queue can be declared with them. In the cluster (RunConfig
`compress=`) only the encoded tensors cross the network.

Calling a compressor on a list of gradients, `comp(grads)`, does encode + decode in one
process (with error feedback where the compressor uses it): what the PS would apply.
All of it is TensorFlow ops, so it runs inside a tf.function.
"""

from __future__ import annotations

import math

ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4}


def check_spec(spec) -> None:
    """Raise ValueError unless `spec` names a compressor: None, 'float16' or {'topk': f}."""
    if spec is None or spec in ("float32", "float16"):
        return
    if isinstance(spec, dict) and set(spec) == {"topk"}:
        f = spec["topk"]
        if isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1:
            return
        raise ValueError(f"top-k fraction must be in (0, 1], got {f!r}")
    raise ValueError(f"compress must be None, 'float16' or {{'topk': fraction}}, got {spec!r}")


def from_spec(spec):
    """The compressor a RunConfig's `compress` value names (None means no compression)."""
    check_spec(spec)
    if spec is None or spec == "float32":
        return Float32()
    if spec == "float16":
        return Float16()
    return TopK(spec["topk"])


class Compressor:
    """Base class: subclasses define wire_spec, encode and decode."""

    name = "?"
    feedback = False  # keep what was not sent and add it to the next gradient

    def wire_spec(self, shapes) -> list[tuple[str, tuple]]:
        """(dtype name, shape) of each tensor a push sends, for gradients of these shapes."""
        raise NotImplementedError

    def encode(self, grads):
        """The tensors to send for these float32 gradients."""
        raise NotImplementedError

    def decode(self, wire, shapes):
        """Dense float32 gradients of these shapes from the tensors that were sent."""
        raise NotImplementedError

    def bytes_for(self, shapes) -> int:
        """Payload of one push for tensors of these shapes."""
        return sum(ITEMSIZE[d] * math.prod(s) for d, s in self.wire_spec(shapes))

    def compress(self, grads, residual=None):
        """The wire tensors for these gradients, with error feedback when given a residual.

        `residual` (tf.Variables shaped like the gradients) holds what earlier pushes did not
        send: it is added before encoding, then set to what this push leaves out.
        """
        if residual is None:
            return self.encode(grads)
        grads = [g + r for g, r in zip(grads, residual)]
        wire = self.encode(grads)
        sent = self.decode(wire, [tuple(g.shape) for g in grads])
        for r, g, s in zip(residual, grads, sent):
            r.assign(g - s)
        return wire

    def __call__(self, grads):
        """compress + decode in one process: the gradients the PS would apply."""
        import tensorflow as tf

        if self.feedback and getattr(self, "residual", None) is None:
            self.residual = [tf.Variable(tf.zeros_like(g), trainable=False) for g in grads]
        wire = self.compress(grads, self.residual if self.feedback else None)
        return self.decode(wire, [tuple(g.shape) for g in grads])


class Float32(Compressor):
    """No compression: every gradient entry as a 4-byte float."""

    name = "float32"

    def wire_spec(self, shapes):
        return [("float32", tuple(s)) for s in shapes]

    def encode(self, grads):
        return list(grads)

    def decode(self, wire, shapes):
        return list(wire)


class Float16(Compressor):
    """Send gradients as float16: half the bytes, about 3 significant digits."""

    name = "float16"

    def wire_spec(self, shapes):
        return [("float16", tuple(s)) for s in shapes]

    def encode(self, grads):
        import tensorflow as tf

        return [tf.cast(g, tf.float16) for g in grads]

    def decode(self, wire, shapes):
        import tensorflow as tf

        return [tf.cast(w, tf.float32) for w in wire]


class TopK(Compressor):
    """Send only the largest `fraction` of gradient entries (value + int32 index) per tensor.

    The entries not sent are kept in a residual and added to the next gradient (error
    feedback), so nothing is lost, only delayed.
    """

    feedback = True

    def __init__(self, fraction: float):
        check_spec({"topk": fraction})
        self.fraction = fraction
        self.name = f"top-{fraction:.0%}"
        self.residual = None

    def _k(self, size: int) -> int:
        return max(1, math.ceil(self.fraction * size))

    def wire_spec(self, shapes):
        spec = []
        for s in shapes:
            k = self._k(math.prod(s))
            spec += [("float32", (k,)), ("int32", (k,))]
        return spec

    def encode(self, grads):
        import tensorflow as tf

        wire = []
        for g in grads:
            flat = tf.reshape(g, [-1])
            _, idx = tf.math.top_k(tf.abs(flat), k=self._k(int(flat.shape[0])))
            wire += [tf.gather(flat, idx), idx]
        return wire

    def decode(self, wire, shapes):
        import tensorflow as tf

        out = []
        for (values, idx), shape in zip(zip(wire[0::2], wire[1::2]), shapes):
            dense = tf.scatter_nd(tf.expand_dims(idx, 1), values, [math.prod(shape)])
            out.append(tf.reshape(dense, shape))
        return out
