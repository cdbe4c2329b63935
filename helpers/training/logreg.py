"""Softmax regression in TensorFlow, one SGD training loop with TensorBoard logs, and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

# TensorBoard's scalar plugin reads summaries tagged with this metadata. Writing them with
# TF's own tf.summary.write means logging needs no tensorboard package, only viewing does.
_SCALAR = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)


def log_scalar(name: str, value: float, step: int) -> None:
    """Write one scalar to the default tf.summary writer, as tf.summary.scalar would."""
    tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=_SCALAR)


class SoftmaxRegression(tf.Module):
    """p(y | x) = softmax(x W + b); loss = cross-entropy + l2 * ||W||^2 (bias not penalised)."""

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        l2: float = 0.0,
        device: str = "/CPU:0",
        name: str | None = None,
    ):
        super().__init__(name=name)
        if n_features < 1 or n_classes < 2:
            raise ValueError(
                f"need n_features >= 1 and n_classes >= 2, got {n_features} and {n_classes}"
            )
        if not l2 >= 0:
            raise ValueError(f"l2 must be >= 0, got {l2!r}")
        self.l2, self.device = float(l2), device
        with tf.device(device):
            self.w = tf.Variable(tf.zeros([n_features, n_classes]), name="w")
            self.b = tf.Variable(tf.zeros([n_classes]), name="b")

    def logits(self, x):
        return tf.matmul(x, self.w) + self.b

    def losses(self, x, y):
        """Return (mean cross-entropy, the same plus the L2 penalty)."""
        ce = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=self.logits(x))
        )
        return ce, ce + self.l2 * tf.reduce_sum(tf.square(self.w))

    def predict(self, x):
        return tf.argmax(self.logits(x), axis=1, output_type=tf.int64)


@dataclass
class History:
    """What `train` recorded: per epoch (loss and accuracy of each split) and per step."""

    epoch: dict = field(default_factory=dict)  # "<split>_loss" / "<split>_acc" -> list per epoch
    step_lr: list = field(default_factory=list)  # learning rate used at each step
    step_loss: list = field(default_factory=list)  # regularised mini-batch loss at each step
    weights: list = field(default_factory=list)  # (W, b) as numpy arrays after each epoch
    log_dir: str | None = None

    def final(self, key: str) -> float:
        return self.epoch[key][-1]


def sgd_update(model: SoftmaxRegression, x, y, lr):
    """One SGD step on a batch: theta <- theta - lr * gradient of the regularised loss."""
    variables = (model.w, model.b)
    with tf.GradientTape() as tape:
        _, loss = model.losses(x, y)
    for var, grad in zip(variables, tape.gradient(loss, variables)):
        var.assign_sub(lr * grad)
    return loss


def train(
    model: SoftmaxRegression,
    splits: dict,
    schedule,
    *,
    epochs: int,
    batch_size: int,
    seed: int = 0,
    log_dir: Path | str | None = None,
    progress: bool = True,
) -> History:
    """Train `model` with mini-batch SGD, theta <- theta - lr(step) * grad, and record it all.

    Args:
        model: a SoftmaxRegression (its variables stay on its device).
        splits: {"train": (X, y), ...}; the model learns from "train", the others
            (e.g. "dev", "test") are only evaluated after each epoch.
        schedule: a callable step -> learning rate (a Keras LearningRateSchedule).
        epochs: passes over the training set.
        batch_size: examples per SGD step.
        seed: seed of the per-epoch shuffles.
        log_dir: write TensorBoard scalars there (per epoch, and the rate per step).
        progress: show a tqdm bar over epochs.
    Returns:
        A History. A loss that overflows is recorded as inf/nan, not an error.
    """
    from tqdm.auto import tqdm

    _check(splits, epochs, batch_size)
    with tf.device(model.device):
        tensors = {
            s: (tf.constant(x, tf.float32), tf.constant(y, tf.int64))
            for s, (x, y) in splits.items()
        }
    sgd_step, evaluate = _compiled(model, tensors["train"], schedule)
    history = History(log_dir=str(log_dir) if log_dir is not None else None)
    writer = tf.summary.create_file_writer(str(log_dir)) if log_dir is not None else None
    rng = np.random.default_rng(seed)
    n, step = int(tensors["train"][0].shape[0]), 0
    try:
        for epoch in tqdm(range(epochs), desc="epochs", disable=not progress, leave=False):
            order = rng.permutation(n)
            for start in range(0, n, batch_size):
                idx = tf.constant(order[start : start + batch_size])
                loss, lr = (float(v) for v in sgd_step(idx, tf.constant(step, tf.int64)))
                history.step_lr.append(lr)
                history.step_loss.append(loss)
                if writer is not None and step % 10 == 0:
                    with writer.as_default():
                        log_scalar("learning_rate", lr, step)
                        log_scalar("batch_loss", loss, step)
                step += 1
            _evaluate_splits(evaluate, tensors, history, writer, epoch)
            history.weights.append((model.w.numpy(), model.b.numpy()))
    finally:
        if writer is not None:
            writer.close()
    return history


def sharpness(model: SoftmaxRegression, x, y) -> float:
    """The largest eigenvalue of the Hessian of the regularised full-batch loss at the model's
    weights (see `sharpness_along`). NaN if the weights are not finite."""
    return sharpness_along(model, x, y, [(model.w.numpy(), model.b.numpy())])[0]


def sharpness_along(model: SoftmaxRegression, x, y, weights) -> list[float]:
    """The sharpness at each (W, b) of `weights` (a History's, say), loaded into `model` in
    turn: the largest eigenvalue of the regularised full-batch loss's Hessian, from SciPy's
    Lanczos solver (`eigsh`) on Hessian-vector products of two nested GradientTapes, so the
    Hessian itself is never formed. The data become one tensor and the product is traced once
    for all of them. NaN for weights that are not finite.

    Gradient descent with a fixed rate eta on a quadratic diverges along the top eigenvector once
    eta > 2 / sharpness: the stability limit notebook 02 draws. The model's weights are left at
    the last (W, b).
    """
    from scipy.sparse.linalg import LinearOperator, eigsh

    with tf.device(model.device):
        x, y = tf.constant(x, tf.float32), tf.constant(y, tf.int64)
    variables = (model.w, model.b)
    sizes = [int(np.prod(v.shape)) for v in variables]

    @tf.function
    def hvp(flat):
        parts = tf.split(flat, sizes)
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                _, loss = model.losses(x, y)
            grads = inner.gradient(loss, variables)
            along = tf.add_n(
                [tf.reduce_sum(g * tf.reshape(d, g.shape)) for g, d in zip(grads, parts)]
            )
        return tf.concat([tf.reshape(h, [-1]) for h in outer.gradient(along, variables)], 0)

    n = sum(sizes)
    op = LinearOperator(
        (n, n), matvec=lambda v: hvp(tf.constant(v.ravel(), tf.float32)).numpy(), dtype=np.float32
    )
    v0 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = []
    for w, b in weights:
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(b))):
            out.append(float("nan"))
            continue
        model.w.assign(w)
        model.b.assign(b)
        out.append(float(eigsh(op, k=1, which="LA", v0=v0, tol=1e-4, return_eigenvectors=False)[0]))
    return out


def _check(splits: dict, epochs, batch_size) -> None:
    if "train" not in splits:
        raise ValueError(f"splits needs a 'train' entry, got {sorted(splits)}")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def _compiled(model: SoftmaxRegression, train, schedule):
    """The SGD step on a batch of training rows (by index) and the evaluation of a split."""
    x_train, y_train = train
    # Signatures with a free batch dimension: one trace serves every batch and every split
    # (the last, smaller batch and dev/test would otherwise each trace again).
    batch_x = tf.TensorSpec([None, x_train.shape[1]], tf.float32)
    batch_y = tf.TensorSpec([None], tf.int64)

    @tf.function(input_signature=[batch_y, tf.TensorSpec([], tf.int64)])
    def sgd_step(idx, step):
        with tf.device(model.device):
            lr = tf.cast(schedule(step), tf.float32)
            loss = sgd_update(model, tf.gather(x_train, idx), tf.gather(y_train, idx), lr)
        return loss, lr

    @tf.function(input_signature=[batch_x, batch_y])
    def evaluate(x, y):
        with tf.device(model.device):
            _, loss = model.losses(x, y)
            acc = tf.reduce_mean(tf.cast(tf.equal(model.predict(x), y), tf.float32))
        return loss, acc

    return sgd_step, evaluate


def _evaluate_splits(evaluate, tensors: dict, history: History, writer, epoch: int) -> None:
    """Loss and accuracy of every split after an epoch, into the history (and TensorBoard)."""
    for split, (x, y) in tensors.items():
        loss, acc = (float(v) for v in evaluate(x, y))
        history.epoch.setdefault(f"{split}_loss", []).append(loss)
        history.epoch.setdefault(f"{split}_acc", []).append(acc)
        if writer is not None:
            with writer.as_default():
                log_scalar(f"{split}/loss", loss, epoch + 1)
                log_scalar(f"{split}/accuracy", acc, epoch + 1)


def metrics_table(y_true, y_pred) -> dict:
    """Accuracy and macro-averaged precision, recall and F1, from scikit-learn.

    Macro averages run over the classes present in y_true or y_pred; a class that is never
    predicted (or never true) scores 0 there instead of raising a warning.
    """
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    if y_true.shape != y_pred.shape or y_true.ndim != 1 or len(y_true) == 0:
        raise ValueError(
            f"y_true and y_pred must be non-empty 1-D arrays of one length, "
            f"got shapes {y_true.shape} and {y_pred.shape}"
        )
    p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, average="macro", zero_division=0)
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_precision": float(p),
        "macro_recall": float(r),
        "macro_f1": float(f),
    }


def oscillation(losses) -> float:
    """Fraction of consecutive steps where a loss curve went up (inf/nan count as up)."""
    losses = np.asarray(losses, dtype=float)
    if len(losses) < 2:
        raise ValueError(f"need at least 2 losses, got {len(losses)}")
    bad = ~np.isfinite(losses)
    with np.errstate(invalid="ignore"):  # inf - inf
        ups = (np.diff(np.where(bad, np.inf, losses)) > 0) | bad[1:]
    return float(ups.mean())
