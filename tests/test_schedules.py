"""The schedules against Keras' own ExponentialDecay and CosineDecay where they overlap."""
import keras
import numpy as np
import pytest

from helpers import schedules

STEPS = np.arange(0, 2001, 7)


def keras_rates(schedule):
    """Evaluate one step at a time: Keras' CosineDecay takes only scalar steps."""
    return np.array([float(schedule(int(step))) for step in STEPS])


@pytest.mark.parametrize("factor", [0.96, 1.04])
@pytest.mark.parametrize("staircase", [True, False])
def test_exponential_matches_keras_exponential_decay(factor, staircase):
    ours = schedules.Exponential(0.5, factor, 100, staircase=staircase)
    ref = keras.optimizers.schedules.ExponentialDecay(0.5, 100, factor, staircase=staircase)
    np.testing.assert_allclose(keras_rates(ours), keras_rates(ref), rtol=1e-5)


def test_staircase_is_flat_within_each_block_and_continuous_is_not():
    stair = schedules.rates(schedules.Exponential(1.0, 0.96, 100, staircase=True), 300)
    smooth = schedules.rates(schedules.Exponential(1.0, 0.96, 100), 300)
    assert len(np.unique(stair.round(5))) == 3
    assert np.all(np.diff(smooth) < 0)


def test_constant_is_exponential_decay_with_factor_one():
    ref = keras.optimizers.schedules.ExponentialDecay(0.3, 100, 1.0)
    np.testing.assert_allclose(keras_rates(schedules.Constant(0.3)), keras_rates(ref), rtol=1e-6)


@pytest.mark.parametrize("start,floor", [(0.0, 0.0), (0.01, 0.1)])
def test_warmup_cosine_matches_keras_cosine_decay(start, floor):
    ours = schedules.WarmupCosine(peak=0.8, warmup=150, decay=1200, start=start, floor=floor)
    ref = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=start, decay_steps=1200, alpha=floor,
        warmup_target=0.8, warmup_steps=150)
    np.testing.assert_allclose(keras_rates(ours), keras_rates(ref), rtol=1e-5, atol=1e-7)


def test_schedules_drive_a_keras_optimizer():
    var = keras.Variable(1.0)
    opt = keras.optimizers.SGD(learning_rate=schedules.Exponential(0.1, 0.5, 1, staircase=True))
    for _ in range(2):
        opt.apply_gradients([(keras.ops.convert_to_tensor(1.0), var)])
    np.testing.assert_allclose(float(var.numpy()), 1.0 - 0.1 - 0.05, rtol=1e-6)


def test_get_config_round_trips():
    for sched in (schedules.Constant(0.2), schedules.Exponential(0.1, 1.04, 100, True),
                  schedules.WarmupCosine(1.0, 10, 90, 0.1, 0.05)):
        clone = type(sched).from_config(sched.get_config())
        np.testing.assert_allclose(schedules.rates(clone, 200), schedules.rates(sched, 200))


@pytest.mark.parametrize("make,message", [
    (lambda: schedules.Constant(0), "rate must be a positive number, got 0"),
    (lambda: schedules.Exponential(0.1, -0.96, 100), "factor must be a positive number"),
    (lambda: schedules.Exponential(0.1, 0.96, 0), "every must be a positive integer, got 0"),
    (lambda: schedules.Exponential(0.1, 0.96, 2.5), "every must be a positive integer"),
    (lambda: schedules.WarmupCosine(0.1, 10, 100, start=0.5), "start must be between 0"),
    (lambda: schedules.WarmupCosine(0.1, 10, 100, floor=2), "floor is a fraction"),
    (lambda: schedules.rates(schedules.Constant(0.1), 0), "steps must be a positive integer"),
])
def test_bad_arguments_are_refused_with_a_clear_message(make, message):
    with pytest.raises(ValueError, match=message):
        make()
