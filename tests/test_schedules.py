"""The schedules Keras lacks, checked against Keras' own where they overlap."""

import keras
import numpy as np
import pytest

from helpers.training import schedules

STEPS = np.arange(0, 2001, 7)


def keras_rates(schedule):
    """Evaluate one step at a time: Keras' CosineDecay takes only scalar steps."""
    return np.array([float(schedule(int(step))) for step in STEPS])


def test_constant_is_exponential_decay_with_factor_one():
    ref = keras.optimizers.schedules.ExponentialDecay(0.3, 100, 1.0)
    np.testing.assert_allclose(keras_rates(schedules.Constant(0.3)), keras_rates(ref), rtol=1e-6)


@pytest.mark.parametrize(
    "schedule",
    [
        keras.optimizers.schedules.ExponentialDecay(0.5, 100, 0.96, staircase=True),
        keras.optimizers.schedules.CosineDecay(
            0.01, 1200, alpha=0.1, warmup_target=0.8, warmup_steps=150
        ),
        schedules.Constant(0.2),
    ],
)
def test_rates_evaluates_any_schedule_step_by_step(schedule):
    np.testing.assert_allclose(
        schedules.rates(schedule, 2001)[STEPS], keras_rates(schedule), rtol=1e-5, atol=1e-7
    )


def test_staircase_is_flat_within_each_block_and_continuous_is_not():
    decay = keras.optimizers.schedules.ExponentialDecay
    stair = schedules.rates(decay(1.0, 100, 0.96, staircase=True), 300)
    smooth = schedules.rates(decay(1.0, 100, 0.96), 300)
    assert len(np.unique(stair.round(5))) == 3
    assert np.all(np.diff(smooth) < 0)


def test_constant_drives_a_keras_optimizer_and_round_trips():
    var = keras.Variable(1.0)
    opt = keras.optimizers.SGD(learning_rate=schedules.Constant(0.1))
    for _ in range(2):
        opt.apply_gradients([(keras.ops.convert_to_tensor(1.0), var)])
    np.testing.assert_allclose(float(var.numpy()), 1.0 - 0.1 - 0.1, rtol=1e-6)
    clone = schedules.Constant.from_config(schedules.Constant(0.2).get_config())
    np.testing.assert_allclose(schedules.rates(clone, 20), 0.2)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: schedules.Constant(0), "rate must be a positive number, got 0"),
        (lambda: schedules.Constant(True), "rate must be a positive number, got True"),
        (lambda: schedules.rates(schedules.Constant(0.1), 0), "steps must be a positive integer"),
    ],
)
def test_bad_arguments_are_refused_with_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_rates_of_many_schedules_log_no_retracing_warning(caplog):
    decay = keras.optimizers.schedules.ExponentialDecay
    with caplog.at_level("WARNING", logger="tensorflow"):
        for factor in (0.9, 0.92, 0.94, 0.96, 0.98, 1.02, 1.04):  # past TF's limit of 5
            schedules.rates(decay(0.5, 100, factor), 50)
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
