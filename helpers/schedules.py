"""Learning-rate schedules as Keras 3 LearningRateSchedule classes, short enough to read."""
from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops


def _check_positive(name: str, value, integer: bool = False) -> None:
    kind = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        what = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {what}, got {value!r}")


class Constant(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = rate."""

    def __init__(self, rate: float):
        _check_positive("rate", rate)
        self.rate = float(rate)

    def __call__(self, step):
        return ops.convert_to_tensor(self.rate, dtype="float32") + 0.0 * ops.cast(step, "float32")

    def get_config(self):
        return {"rate": self.rate}


class Exponential(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = initial * factor ** (step / every), with the exponent floored if staircase.

    factor < 1 decays (x0.96 every 100 steps), factor > 1 grows (x1.04 every 100 steps).
    """

    def __init__(self, initial: float, factor: float, every: int, staircase: bool = False):
        _check_positive("initial", initial)
        _check_positive("factor", factor)
        _check_positive("every", every, integer=True)
        self.initial, self.factor, self.every = float(initial), float(factor), int(every)
        self.staircase = bool(staircase)

    def __call__(self, step):
        p = ops.cast(step, "float32") / self.every
        if self.staircase:
            p = ops.floor(p)
        return self.initial * ops.power(self.factor, p)

    def get_config(self):
        return {"initial": self.initial, "factor": self.factor, "every": self.every,
                "staircase": self.staircase}


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Rise linearly from `start` to `peak` over `warmup` steps, then follow half a cosine
    from `peak` down to `floor * peak` over `decay` steps, and stay there."""

    def __init__(self, peak: float, warmup: int, decay: int, start: float = 0.0,
                 floor: float = 0.0):
        _check_positive("peak", peak)
        _check_positive("warmup", warmup, integer=True)
        _check_positive("decay", decay, integer=True)
        if not 0.0 <= start <= peak:
            raise ValueError(f"start must be between 0 and peak={peak}, got {start!r}")
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"floor is a fraction of peak in [0, 1], got {floor!r}")
        self.peak, self.warmup, self.decay = float(peak), int(warmup), int(decay)
        self.start, self.floor = float(start), float(floor)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        rising = self.start + (self.peak - self.start) * step / self.warmup
        done = ops.minimum(ops.maximum(step - self.warmup, 0.0) / self.decay, 1.0)
        cosine = 0.5 * (1.0 + ops.cos(math.pi * done))
        falling = self.peak * ((1.0 - self.floor) * cosine + self.floor)
        return ops.where(step < self.warmup, rising, falling)

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup, "decay": self.decay,
                "start": self.start, "floor": self.floor}


def rates(schedule, steps: int) -> np.ndarray:
    """Evaluate a schedule at steps 0..steps-1 (for plotting)."""
    _check_positive("steps", steps, integer=True)
    return np.asarray(keras.ops.convert_to_numpy(schedule(np.arange(steps))), dtype=np.float64)
