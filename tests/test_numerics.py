"""The simulator's numerics: real gradients on the versions the simulated workers read, in the
simulated order. One async worker must be plain SGD over its own batches (checked against an
independent loop); several learn, with stale gradients, deterministically; what is not
simulated numerically is refused by name."""

import numpy as np
import pytest

from helpers.cluster import protocol
from helpers.sim.numerics import Numerics
from helpers.sim.simulator import Costs, simulate

FIXED = Costs(compute_s=0.004, pull_s=0.001, push_s=0.001, apply_s=0.0005)


def cfg(**kw):
    kw.setdefault("steps", 60)
    kw.setdefault("train_size", 2000)
    kw.setdefault("test_size", 500)
    return protocol.validate(protocol.RunConfig(**kw))


def _plain_sgd(c, segments):
    """An independent SGD loop: the same first parameters, one worker's batches drawn by its
    own rule (a permutation per pass from default_rng([seed, worker])), one step each; each
    segment (from, to) starts from the parameters at update `from` with the batches anew."""
    import keras
    import tensorflow as tf

    from helpers.data import arrays
    from helpers.training import models

    x, y, _, _, classes = arrays.load_arrays(c.data, c.train_size, c.test_size, c.seed)
    model = models.build(c.model, x.shape[1:], classes, c.seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kept = {0: [v.numpy() for v in model.trainable_variables]}
    for start, stop in segments:
        for v, value in zip(model.trainable_variables, kept[start]):
            v.assign(value)
        rng = np.random.default_rng([c.seed, 0])
        order, pos = rng.permutation(len(x)), 0
        for update in range(start, stop):
            if pos + c.batch_size > len(x):
                order, pos = rng.permutation(len(x)), 0
            idx = order[pos : pos + c.batch_size]
            pos += c.batch_size
            with tf.GradientTape() as tape:
                loss = loss_fn(y[idx], model(x[idx], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            for v, g in zip(model.trainable_variables, grads):
                v.assign_sub(c.lr * g)
            kept[update + 1] = [v.numpy() for v in model.trainable_variables]
    return model.trainable_variables


def test_one_async_worker_is_plain_sgd_over_its_batches(shared_data):
    c = cfg(workers=1, mode="async", lr=0.2)
    num = Numerics(c)
    simulate(c, FIXED, numerics=num)
    assert num.version == c.steps
    for mine, theirs in zip(num.params[num.version], _plain_sgd(c, [(0, c.steps)])):
        np.testing.assert_allclose(mine, theirs.numpy(), atol=1e-5)


def test_a_resumed_run_goes_on_from_its_checkpoint_with_its_batches_anew(shared_data):
    """PS killed at update 35, last checkpoint at 20: the resumed run starts from the
    checkpoint's parameters, and its new worker draws its batches from the start again."""
    c = cfg(
        workers=1,
        mode="async",
        lr=0.2,
        checkpoint_every=20,
        faults={"ps": {"kind": "kill", "at": 35}},
    )
    num = Numerics(c)
    r = simulate(c, FIXED, numerics=num)
    assert r.lost == 15 and num.version == c.steps
    for mine, theirs in zip(num.params[num.version], _plain_sgd(c, [(0, 35), (20, c.steps)])):
        np.testing.assert_allclose(mine, theirs.numpy(), atol=1e-5)


def test_several_workers_learn_on_stale_versions_the_same_way_each_time(shared_data):
    c = cfg(workers=4, mode="async", steps=200)
    a = simulate(c, FIXED, numerics=Numerics(c, eval_every=50))
    b = simulate(c, FIXED, numerics=Numerics(c, eval_every=50))
    assert a.staleness.max() >= 1  # the gradients really were computed on older versions
    assert a.test_accuracy == b.test_accuracy and a.accuracy == b.accuracy
    assert [v for _, v, _ in a.accuracy] == [50, 100, 150, 200]
    times = [t for t, _, _ in a.accuracy]
    assert times == sorted(times) and times[-1] == pytest.approx(a.seconds)
    assert a.test_accuracy > 0.75 and a.accuracy[-1][2] > a.accuracy[0][2] - 0.05


def test_backup_folds_and_sync_averages_with_the_protocols_weights(shared_data):
    for mode, extra in (("sync", {}), ("backup", {"k": 2, "stale": "fold"})):
        c = cfg(workers=3, mode=mode, **extra)
        num = Numerics(c)
        r = simulate(c, FIXED, numerics=num)
        assert num.version == r.updates == c.steps and r.test_accuracy > 0.7, mode
        if mode == "sync":  # the mean of the N gradients: weights adding up to 1
            assert num.weight_sums == pytest.approx([1.0] * c.steps)
    assert r.folded > 0
    # folded late gradients lengthen the step, within the fold's bound (0.5 by default)
    assert 1.0 < max(num.weight_sums) <= 1.5 + 1e-9


def test_only_versions_a_worker_may_still_push_against_are_kept(shared_data):
    c = cfg(workers=8, mode="async", steps=400)
    num = Numerics(c)
    simulate(c, FIXED, numerics=num)
    assert len(num.params) <= 3 * 8, len(num.params)


@pytest.mark.parametrize(
    "kw,named",
    [({"n_fetch": 2}, "n_fetch=2"), ({"compress": "float16"}, "compress='float16'")],
)
def test_what_numerics_cannot_follow_is_refused_by_name(kw, named, shared_data):
    with pytest.raises(ValueError, match=named):
        Numerics(cfg(workers=2, mode="async", **kw))


def test_numerics_of_another_configuration_or_a_bad_eval_every_are_refused(shared_data):
    c = cfg(workers=2, mode="async")
    with pytest.raises(ValueError, match="eval_every must be an integer >= 0, got -1"):
        Numerics(c, eval_every=-1)
    other = cfg(workers=2, mode="async")
    with pytest.raises(ValueError, match="the same configuration"):
        simulate(c, FIXED, numerics=Numerics(other))
