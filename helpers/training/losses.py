"""Losses for the MNIST sweep: a registry over Keras' losses plus our weighted kappa loss."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops


class WeightedKappaLoss(keras.losses.Loss):
    """log(1 - kappa + eps), kappa being Cohen's weighted kappa of soft predictions.

    Same formula as TensorFlow Addons' WeightedKappaLoss (which did not move to Keras 3):
    numerator = sum_i sum_j w[label_i, j] * p_ij, denominator = hist_true @ W @ hist_pred / N,
    with w[a, b] = |a - b| / (K - 1) ("linear") or (a - b)^2 / (K - 1)^2 ("quadratic").
    y_true is one-hot (N, K); y_pred holds probabilities, or logits with from_logits=True.
    The loss is one number for the whole batch (kappa does not decompose per example).
    """

    def __init__(
        self,
        num_classes: int,
        weightage: str = "quadratic",
        epsilon: float = 1e-6,
        from_logits: bool = False,
        name: str = "weighted_kappa_loss",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        if weightage not in ("linear", "quadratic"):
            raise ValueError(f"weightage must be 'linear' or 'quadratic', got {weightage!r}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes, self.weightage = int(num_classes), weightage
        self.epsilon, self.from_logits = float(epsilon), from_logits
        labels = ops.arange(num_classes, dtype="float32")
        diff = ops.subtract(labels[:, None], labels[None, :])
        if weightage == "linear":
            self.weight_mat = ops.abs(diff) / (num_classes - 1)
        else:
            self.weight_mat = ops.square(diff) / (num_classes - 1) ** 2

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "float32")
        y_pred = ops.cast(y_pred, "float32")
        if self.from_logits:
            y_pred = ops.softmax(y_pred, axis=-1)
        weight = ops.matmul(y_true, self.weight_mat)  # row i: w[label_i, :]
        numerator = ops.sum(weight * y_pred)
        hist_true = ops.sum(y_true, axis=0)
        hist_pred = ops.sum(y_pred, axis=0)
        denominator = ops.sum(hist_true[:, None] * self.weight_mat * hist_pred[None, :])
        denominator = denominator / ops.cast(ops.shape(y_true)[0], "float32")
        ratio = ops.where(denominator > 0, numerator / ops.maximum(denominator, 1e-30), 0.0)
        return ops.log(ratio + self.epsilon)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "weightage": self.weightage,
            "epsilon": self.epsilon,
            "from_logits": self.from_logits,
        }


def weighted_sigmoid_cross_entropy(y_true, logits, pos_weight: float):
    """Per-class sigmoid cross-entropy with the positive term scaled by pos_weight, mean over
    all."""
    if pos_weight <= 0:
        raise ValueError(f"pos_weight must be > 0, got {pos_weight}")
    y_true = tf.cast(y_true, logits.dtype)
    return tf.reduce_mean(tf.nn.weighted_cross_entropy_with_logits(y_true, logits, pos_weight))


def _onehot(fn, num_classes):
    return lambda labels, logits: fn(tf.one_hot(labels, num_classes), logits)


def make_loss(name: str, num_classes: int = 10):
    """Return loss(labels, logits) -> scalar for integer labels and the model's logits.

    Args:
        name: a key of LOSSES, e.g. "sparse_softmax_ce" or "weighted_kappa".
        num_classes: number of classes (for the one-hot encodings).

    Raises:
        ValueError: for an unknown name.
    """
    builders = {
        "softmax_ce": lambda: _onehot(
            keras.losses.CategoricalCrossentropy(from_logits=True), num_classes
        ),
        "sparse_softmax_ce": lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        "weighted_ce_pos2": lambda: _onehot(
            lambda y, z: weighted_sigmoid_cross_entropy(y, z, 2.0), num_classes
        ),
        "weighted_ce_pos0.5": lambda: _onehot(
            lambda y, z: weighted_sigmoid_cross_entropy(y, z, 0.5), num_classes
        ),
        "sigmoid_focal_ce": lambda: _onehot(
            keras.losses.BinaryFocalCrossentropy(
                apply_class_balancing=True, alpha=0.25, gamma=2.0, from_logits=True
            ),
            num_classes,
        ),
        "sigmoid_ce": lambda: _onehot(
            keras.losses.BinaryCrossentropy(from_logits=True), num_classes
        ),
        "weighted_kappa": lambda: _onehot(
            WeightedKappaLoss(num_classes, from_logits=True), num_classes
        ),
    }
    if name not in builders:
        raise ValueError(f"unknown loss {name!r}: choose one of {sorted(builders)}")
    return builders[name]()


LOSSES = (
    "softmax_ce",
    "sparse_softmax_ce",
    "weighted_ce_pos2",
    "weighted_ce_pos0.5",
    "sigmoid_focal_ce",
    "sigmoid_ce",
    "weighted_kappa",
)
