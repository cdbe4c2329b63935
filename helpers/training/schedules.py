"""What Keras' learning-rate schedules lack: a constant schedule, and evaluating any schedule.

The schedules themselves are Keras' (`keras.optimizers.schedules.ExponentialDecay`,
`CosineDecay(warmup_target=..., warmup_steps=...)`, ...). Notebook 02 writes the exponential
family once by hand, checks it against `ExponentialDecay`, then uses Keras' classes.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def _check_positive(name: str, value, integer: bool = False) -> None:
    kind = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        what = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {what}, got {value!r}")


class Constant(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = rate. Keras takes a plain float for this; a schedule object lets a training
    loop that calls `schedule(step)` treat a constant rate like any other schedule."""

    def __init__(self, rate: float):
        _check_positive("rate", rate)
        self.rate = float(rate)

    def __call__(self, step):
        return ops.convert_to_tensor(self.rate, dtype="float32") + 0.0 * ops.cast(step, "float32")

    def get_config(self):
        return {"rate": self.rate}


def rates(schedule, steps: int) -> np.ndarray:
    """Evaluate a schedule at steps 0..steps-1 (for plotting).

    Some Keras schedules (CosineDecay with warm-up) take only a scalar step, and one eager call per
    step of a long run adds up to seconds. One graph that maps the schedule over the steps takes a
    small fraction of that. It is built and run directly, not as a tf.function: a tf.function made
    per schedule is traced once per call, and a notebook plotting six schedules would trigger
    TensorFlow's retracing warning.
    """
    import tensorflow as tf

    _check_positive("steps", steps, integer=True)
    graph = tf.Graph()
    with graph.as_default():
        values = tf.map_fn(
            lambda t: tf.cast(schedule(t), tf.float32),
            tf.range(steps, dtype=tf.int64),
            fn_output_signature=tf.float32,
        )
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(values).astype(np.float64)
