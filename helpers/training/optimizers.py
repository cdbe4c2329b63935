"""Named optimizer factories, including proximal GD and proximal Adagrad for Keras 3."""

from __future__ import annotations

import keras
from keras import initializers, ops


def _shrink(prox, lr, l1, l2):
    """Soft-threshold by lr*l1, then scale by 1/(1 + lr*l2): the proximal step of l1 + l2/2."""
    lr_l1 = ops.multiply(lr, l1)
    mag = ops.maximum(ops.subtract(ops.abs(prox), lr_l1), 0.0)
    return ops.divide(ops.multiply(ops.sign(prox), mag), ops.add(1.0, ops.multiply(lr, l2)))


class _Proximal(keras.optimizers.Optimizer):
    """Shared constructor and config for the two proximal optimizers."""

    def __init__(self, learning_rate=0.01, l1=0.0, l2=0.0, name=None, **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        for key, value in (("l1", l1), ("l2", l2)):
            if value < 0:
                raise ValueError(f"{key} regularization strength must be >= 0, got {value}")
        self.l1 = float(l1)
        self.l2 = float(l2)

    def get_config(self):
        config = super().get_config()
        config.update({"l1": self.l1, "l2": self.l2})
        return config


class ProximalGradientDescent(_Proximal):
    """Gradient step, then the proximal step of l1*|w| + l2/2*w^2 (as TF1's optimizer)."""

    def __init__(
        self, learning_rate=0.01, l1=0.0, l2=0.0, name="proximal_gradient_descent", **kwargs
    ):
        super().__init__(learning_rate, l1, l2, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        prox = ops.subtract(variable, ops.multiply(lr, gradient))
        self.assign(variable, _shrink(prox, lr, self.l1, self.l2))


class ProximalAdagrad(_Proximal):
    """Adagrad step (lr / sqrt(sum of g^2)), then the same proximal step per coordinate."""

    def __init__(
        self,
        learning_rate=0.01,
        initial_accumulator_value=0.1,
        l1=0.0,
        l2=0.0,
        name="proximal_adagrad",
        **kwargs,
    ):
        if initial_accumulator_value <= 0:
            raise ValueError(
                "initial_accumulator_value must be > 0 (it is divided by), "
                f"got {initial_accumulator_value}"
            )
        super().__init__(learning_rate, l1, l2, name=name, **kwargs)
        self.initial_accumulator_value = float(initial_accumulator_value)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        init = initializers.Constant(self.initial_accumulator_value)
        self._accumulators = self.add_optimizer_variables(var_list, "accumulator", initializer=init)

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        accum = self._accumulators[self._get_variable_index(variable)]
        self.assign_add(accum, ops.square(gradient))
        step = ops.divide(lr, ops.sqrt(accum))  # per-coordinate learning rate
        prox = ops.subtract(variable, ops.multiply(step, gradient))
        self.assign(variable, _shrink(prox, step, self.l1, self.l2))

    def get_config(self):
        config = super().get_config()
        config["initial_accumulator_value"] = self.initial_accumulator_value
        return config


# name -> (factory, tunable hyperparameters other than learning_rate, with their defaults)
OPTIMIZERS = {
    "gd": (keras.optimizers.SGD, {}),
    "momentum": (keras.optimizers.SGD, {"momentum": 0.9, "nesterov": False}),
    "adam": (keras.optimizers.Adam, {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}),
    "rmsprop": (keras.optimizers.RMSprop, {"rho": 0.9, "momentum": 0.0, "epsilon": 1e-7}),
    "adagrad": (keras.optimizers.Adagrad, {"initial_accumulator_value": 0.1, "epsilon": 1e-7}),
    "adadelta": (keras.optimizers.Adadelta, {"rho": 0.95, "epsilon": 1e-7}),
    "ftrl": (
        keras.optimizers.Ftrl,
        {
            "learning_rate_power": -0.5,
            "initial_accumulator_value": 0.1,
            "l1_regularization_strength": 0.0,
            "l2_regularization_strength": 0.0,
        },
    ),
    "proximal_gd": (ProximalGradientDescent, {"l1": 0.0, "l2": 0.0}),
    "proximal_adagrad": (ProximalAdagrad, {"initial_accumulator_value": 0.1, "l1": 0.0, "l2": 0.0}),
}


def make_optimizer(name: str, learning_rate: float, **hparams) -> keras.optimizers.Optimizer:
    """Build a fresh optimizer from the registry.

    Args:
        name: a key of OPTIMIZERS, e.g. "adam" or "proximal_adagrad".
        learning_rate: the step size (> 0).
        **hparams: overrides of that optimizer's tunable hyperparameters.

    Raises:
        ValueError: for an unknown name, a bad learning rate or an unknown hyperparameter.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: choose one of {sorted(OPTIMIZERS)}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    factory, defaults = OPTIMIZERS[name]
    unknown = set(hparams) - set(defaults)
    if unknown:
        raise ValueError(
            f"{name} has no hyperparameter(s) {sorted(unknown)}: "
            f"tunable ones are {sorted(defaults)}"
        )
    return factory(learning_rate=learning_rate, **{**defaults, **hparams})
