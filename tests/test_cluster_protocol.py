"""Pure-Python tests of the cluster protocol rules (no TensorFlow, no processes)."""

import re
import subprocess
import sys

import pytest

from helpers.cluster import protocol
from helpers.cluster.protocol import BackupAggregator, Downpour, Push, RunConfig, validate


def test_protocol_module_does_not_import_tensorflow():
    code = "import sys, helpers.cluster.protocol; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------------- SSP gate
@pytest.mark.parametrize(
    "clock,clocks,s,ok",
    [
        (0, [0, 0, 0], 0, True),
        (1, [1, 0, 1], 0, False),
        (1, [1, 0, 1], 1, True),
        (4, [4, 1, 2], 2, False),
        (3, [3, 1, 2], 2, True),
        (7, [], 0, True),
    ],
)
def test_ssp_gate(clock, clocks, s, ok):
    assert protocol.ssp_may_step(clock, clocks, s) is ok


def test_ssp_grants_agree_with_the_gate():
    # simulate: a worker holding `granted` tokens may start steps 0..granted-1
    for s in range(4):
        for lo in range(5):
            for granted in range(12):
                more = protocol.ssp_grants(granted, [lo, lo + 2], s)
                allowed = [
                    c
                    for c in range(granted, granted + 20)
                    if protocol.ssp_may_step(c, [lo, lo + 2], s)
                ]
                assert more == len(allowed)


def test_ssp_simulation_never_exceeds_staleness():
    """Fast worker 0 runs until blocked; the gap to the slowest live clock stays <= s."""
    for s in (0, 1, 3):
        clocks, granted = [0, 0, 0], [0, 0, 0]
        for w in range(3):
            granted[w] += protocol.ssp_grants(0, clocks, s)
        for tick in range(200):
            w = 0 if tick % 4 else tick // 4 % 3  # worker 0 three times as often
            if clocks[w] < granted[w]:
                assert clocks[w] - min(clocks) <= s
                clocks[w] += 1
                for v in range(3):
                    granted[v] += protocol.ssp_grants(granted[v], clocks, s)
        assert max(clocks) - min(clocks) <= s + 1


def _grants_over_all_clocks(clocks, granted, s):
    """ssp_grants over every live clock, as the PS granted before the gate was incremental."""
    out = []
    for w in clocks:
        for _ in range(protocol.ssp_grants(granted[w], list(clocks.values()), s)):
            out.append((w, granted[w], min(clocks.values())))
            granted[w] += 1
    return sorted(out)


def test_the_incremental_ssp_gate_grants_what_the_rule_over_all_clocks_grants():
    """SSPGate against ssp_grants over every live clock (the PS's rule before it was made
    incremental), over random pushes and workers leaving, for several bounds."""
    import random

    for seed in range(30):
        rnd = random.Random(seed)
        n, s = rnd.randint(1, 7), rnd.randint(0, 3)
        gate = protocol.SSPGate(range(n), s)
        clocks, granted = {w: 0 for w in range(n)}, {w: 0 for w in range(n)}

        assert sorted(gate.start()) == _grants_over_all_clocks(clocks, granted, s)
        for _ in range(300):
            if not clocks:
                break
            w = rnd.choice(sorted(clocks))
            if rnd.random() < 0.03:  # a worker dies or finishes
                del clocks[w]
                assert sorted(gate.remove(w)) == _grants_over_all_clocks(clocks, granted, s)
            elif clocks[w] < granted[w]:  # it holds a token: it steps and pushes
                assert clocks[w] - min(clocks.values()) <= s
                clocks[w] += 1
                assert sorted(gate.pushed(w)) == _grants_over_all_clocks(clocks, granted, s)
            assert gate.slowest == (min(clocks.values()) if clocks else gate.slowest)


def test_owed_tokens_are_due_once_the_version_passes_what_was_read():
    owed = protocol.OwedTokens()
    owed.owe(0, 3)
    owed.owe(1, 2)
    owed.owe(2, 3)
    assert owed.due(3) == [1] and len(owed) == 2  # read 2 < 3: due; read 3: not yet
    assert owed.due(3) == []
    owed.owe(1, 3)
    assert owed.due(4) == [0, 2, 1] and len(owed) == 0  # in the order they pushed


# ------------------------------------------------------------------------- backup workers
def test_fold_weights_shrink_exponentially_and_respect_the_bound():
    for ages in ([1], [1, 2], [1, 1, 1], [3, 5, 2, 1, 1, 4]):
        w = protocol.fold_weights(ages, fresh_weight=1.0, decay=0.5, bound=0.5)
        assert sum(w) <= 0.5 + 1e-12  # sum(stale alpha) <= (a / 2b) alpha_t
        for (a1, w1), (a2, w2) in zip(zip(ages, w), zip(ages[1:], w[1:])):
            if a1 < a2:
                assert w1 > w2
            if a1 == a2:
                assert w1 == w2
    # a single gradient one version old gets decay * fresh, when that is within the bound
    assert protocol.fold_weights([1], 1.0, decay=0.3, bound=0.5) == [pytest.approx(0.3)]
    assert protocol.fold_weights([2, 3], 2.0, decay=0.5, bound=1.0) == [0.5, 0.25]
    assert protocol.fold_weights([1, 2], 1.0, decay=0.5, bound=0.0) == [0.0, 0.0]


def test_fold_weights_reject_fresh_gradients():
    with pytest.raises(ValueError, match="age >= 1"):
        protocol.fold_weights([0, 1])


def test_backup_takes_first_k_fresh_and_drops_late():
    agg = BackupAggregator(k=2, stale="drop")
    assert agg.offer(Push(0, 0, 0)) is None
    update = agg.offer(Push(2, 0, 0))
    assert [p.worker for p in update.pushes] == [0, 2]
    assert update.weights == [0.5, 0.5] and update.fresh == [True, True]
    assert agg.version == 1
    assert agg.offer(Push(1, 0, 0)) is None  # late: computed on version 0
    assert [p.worker for p in agg.dropped] == [1]


def test_backup_folds_late_gradients_with_decaying_weights():
    agg = BackupAggregator(k=1, stale="fold", decay=0.5, bound=0.5)
    agg.offer(Push(0, 0, 0))  # version 0 -> 1
    agg.offer(Push(0, 1, 1))  # version 1 -> 2
    assert agg.offer(Push(1, 0, 0)) is None  # two versions old: buffered
    assert agg.offer(Push(2, 0, 1)) is None  # one version old: buffered
    update = agg.offer(Push(0, 2, 2))
    assert update.fresh == [True, False, False]
    fresh_w, stale_w = update.weights[0], update.weights[1:]
    assert fresh_w == 1.0
    assert stale_w == protocol.fold_weights([2, 1], 1.0, 0.5, 0.5)
    assert sum(stale_w) <= 0.5 * fresh_w


def test_sync_is_backup_with_k_equal_n():
    agg = BackupAggregator(k=3)
    assert agg.offer(Push(0, 0, 0)) is None and agg.offer(Push(1, 0, 0)) is None
    update = agg.offer(Push(2, 0, 0))
    assert sorted(p.worker for p in update.pushes) == [0, 1, 2]
    assert update.weights == pytest.approx([1 / 3] * 3)


def test_backup_rejects_pushes_from_the_future():
    with pytest.raises(ValueError, match="future"):
        BackupAggregator(k=1).offer(Push(0, 0, 5))


# ------------------------------------------------------------------------- Downpour
def test_downpour_fetch_and_push_schedule():
    d = Downpour(n_fetch=3, n_push=2)
    fetches = [d.fetch(s) for s in range(7)]
    pushes = [d.accumulate() for _ in range(7)]
    assert fetches == [True, False, False, True, False, False, True]
    assert pushes == [False, True, False, True, False, True, False]
    d1 = Downpour()
    assert all(d1.fetch(s) and d1.accumulate() for s in range(5))


def test_downpour_accumulated_push_is_the_mean_of_its_gradients():
    """Replay the worker loop with numbers: each push carries the mean of n_push gradients."""
    d, acc, pushed = Downpour(n_fetch=1, n_push=3), 0.0, []
    grads = [1.0, 2.0, 6.0, 3.0, 3.0, 0.0]
    for g in grads:
        acc += g
        if d.accumulate():
            pushed.append(acc / d.n_push)
            acc = 0.0
    assert pushed == [3.0, 2.0]


def test_staleness_and_lr_schedules():
    assert protocol.staleness(version_read=3, version_before_apply=7) == 4
    assert protocol.learning_rate(0.1, None, 50) == 0.1
    sched = {"name": "exponential", "decay_steps": 10, "decay_rate": 0.5}
    assert protocol.learning_rate(0.1, sched, 20) == pytest.approx(0.025)
    pw = {"name": "piecewise", "boundaries": [10, 20], "values": [1.0, 0.5, 0.1]}
    assert [protocol.learning_rate(0, pw, v) for v in (5, 10, 15, 25)] == [1.0, 1.0, 0.5, 0.1]


def test_lr_schedules_match_keras():
    keras = pytest.importorskip("keras", reason="keras is a project dependency; checks parity")
    ref = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    inv = keras.optimizers.schedules.InverseTimeDecay(0.1, decay_steps=10, decay_rate=0.5)
    for step in (0, 7, 33):
        assert protocol.learning_rate(
            0.1, {"name": "exponential", "decay_steps": 10, "decay_rate": 0.5}, step
        ) == pytest.approx(float(ref(step)))
        assert protocol.learning_rate(
            0.1, {"name": "inverse_time", "decay_steps": 10, "decay_rate": 0.5}, step
        ) == pytest.approx(float(inv(step)))


# ------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(workers=0), "workers must be an integer >= 1, got 0"),
        (dict(workers=2, mode="bogus"), "unknown mode 'bogus'"),
        (dict(workers=2, model="resnet"), "unknown model 'resnet'"),
        (dict(workers=2, steps=0), "steps must be an integer >= 1, got 0"),
        (dict(workers=2, mode="ssp", staleness=-1), "staleness must be >= 0, got -1"),
        (dict(workers=2, mode="backup", k=3), "k must be between 1 and workers=2, got 3"),
        (dict(workers=2, mode="backup", k=0), "k must be between 1 and workers=2, got 0"),
        (dict(workers=2, mode="backup", stale="keep"), "stale must be 'drop' or 'fold'"),
        (dict(workers=2, mode="backup", decay=1.5), "decay must be in"),
        (dict(workers=2, lr=-1), "lr must be a positive number"),
        (dict(workers=2, mode="sync", n_push=2), "n_fetch/n_push apply to mode='async' only"),
        (dict(workers=2, n_fetch=0), "n_fetch must be an integer >= 1"),
        (dict(workers=2, stragglers={5: 2.0}), "straggler worker 5"),
        (dict(workers=2, stragglers={1: 0.5}), "slowdown factor must be >= 1"),
        (dict(workers=2, faults={"ps": {"kind": "explode", "at": 3}}), "a fault is"),
        (
            dict(workers=2, faults={"ps:x": {"kind": "kill", "at": 3}}),
            "faults are keyed by 'ps' (PS task 0), 'ps:J' (PS task J of a sharded cluster) or a "
            "worker in [0, 1], got 'ps:x'",
        ),
        (dict(workers=2, data="imagenet"), "data must be 'mnist'"),
        (dict(workers=4, batch_size=64, train_size=100), "raise train_size"),
        (dict(workers=2, resume=True), "resume=True needs the run_id"),
        (dict(workers=2, worker_timeout=-1), "worker_timeout must be a number of seconds >= 0"),
        (
            dict(workers=2, compress="int8"),
            "compress must be None, 'float16' or {'topk': fraction}",
        ),
        (dict(workers=2, compress={"topk": 0}), "top-k fraction must be in (0, 1], got 0"),
    ],
)
def test_validation_rejects_bad_configs(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        validate(RunConfig(**kwargs))


def test_validation_fills_defaults_and_round_trips():
    cfg = validate(RunConfig(workers=3, mode="backup", stragglers={2: 3.0}))
    assert cfg.k == 2 and cfg.worker_ids == [0, 1, 2]
    again = validate(RunConfig.from_dict(cfg.to_dict()))
    assert again.to_dict() == cfg.to_dict()


def test_event_tail_returns_each_complete_line_once(tmp_path):
    from helpers.cluster.rundir import EventLog, EventTail

    tail = EventTail(tmp_path)
    assert tail.read() == []
    log = EventLog(tmp_path, "ps-0")
    log.write("joined", workers=[0, 1])
    log.write("update", version=1)
    with open(tmp_path / "worker-0.jsonl", "w") as f:
        f.write('{"t": 1.0, "kind": "step", "step": 0}\n{"t": 2.0, "kind": "st')  # mid-write
    first = tail.read()
    assert [(e["source"], e["kind"]) for e in first] == [
        ("ps-0", "joined"),
        ("ps-0", "update"),
        ("worker-0", "step"),
    ]
    with open(tmp_path / "worker-0.jsonl", "a") as f:
        f.write('ep", "step": 1}\n')
    assert [(e["source"], e["step"]) for e in tail.read()] == [("worker-0", 1)]
    assert tail.read() == []
    log.close()


def test_wire_header_and_token_are_the_queue_shapes():
    from helpers.cluster import wire

    assert wire.Header(worker=1, step=2, version=3, kind=wire.GRAD) == (1, 2, 3, wire.GRAD)
    assert len(wire.Header._fields) == 4 and len(wire.Token._fields) == 2
    assert wire.GRAD != wire.DEAD


# ------------------------------------------------------------------------- sharding plan
LENET = [
    (5, 5, 1, 6),
    (6,),
    (5, 5, 6, 16),
    (16,),
    (784, 120),
    (120,),
    (120, 84),
    (84,),
    (84, 10),
    (10,),
]


@pytest.mark.parametrize(
    "shapes", [[(784, 10), (10,)], LENET, [(784, 1024), (1024,), (1024, 1024), (1024,)]]
)
@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_plan_covers_every_row_once_and_balances_the_tasks(shapes, tasks):
    import math

    import numpy as np

    from helpers.cluster import wire

    pieces = wire.plan(shapes, tasks)
    assert pieces == wire.plan(shapes, tasks)  # every process computes the same plan
    for i, shape in enumerate(shapes):  # the pieces of a variable tile its rows in order
        mine = [p for p in pieces if p.var == i]
        assert [p.start for p in mine] == [0] + [p.stop for p in mine[:-1]]
        assert mine[-1].stop == shape[0] and all(p.shape[1:] == shape[1:] for p in mine)
        assert len(mine) <= tasks and len({p.task for p in mine}) == len(mine)
    load = [sum(math.prod(p.shape) for p in pieces if p.task == t) for t in range(tasks)]
    total = sum(math.prod(s) for s in shapes)
    assert sum(load) == total
    if tasks == 1:
        assert [p.shape for p in pieces] == [tuple(s) for s in shapes]
    else:  # no task holds more than its fair share by more than the largest unsplit piece
        biggest = max(math.prod(p.shape) for p in pieces)
        assert max(load) <= total / tasks + biggest, load
    # split and join are inverses, for NumPy arrays as for tensors
    arrays = [np.arange(math.prod(s), dtype="float32").reshape(s) for s in shapes]
    parts = wire.split(arrays, pieces)
    assert [p.shape for p in parts] == [p.shape for p in pieces]
    for a, b in zip(wire.join(parts, pieces, np.concatenate), arrays):
        np.testing.assert_array_equal(a, b)
    tasks_of = wire.by_task(pieces, tasks)
    assert sorted(i for idx in tasks_of for i in idx) == list(range(len(pieces)))


def test_push_keys_are_distinct_per_worker_and_step():
    from helpers.cluster import wire

    keys = {wire.push_key(w, s) for w in range(8) for s in range(-1, 2000)}
    assert len(keys) == 8 * 2001 and min(keys) == 0
