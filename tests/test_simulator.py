"""The simulator against what each protocol must give: closed forms where the costs are fixed,
the counts every update and drop must add up to, stragglers, faults, shared cores, seeds, and the
rule that it and the engine share the protocol's rules instead of writing their own."""

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from helpers.cluster import protocol
from helpers.sim.simulator import Costs, simulate

ROOT = Path(__file__).resolve().parent.parent
FIXED = Costs(compute_s=0.004, pull_s=0.001, push_s=0.002, apply_s=0.0005, decide_s=0.0001)


def cfg(**kw):
    kw.setdefault("steps", 200)
    kw.setdefault("train_size", None)
    return protocol.validate(protocol.RunConfig(**kw))


def test_sync_rounds_take_the_sum_of_their_parts():
    """Fixed costs: a round is pull + compute + push, the PS deciding on N pushes, one apply."""
    for n in (1, 3, 8):
        r = simulate(cfg(workers=n, mode="sync"), FIXED)
        round_s = 0.001 + 0.004 + 0.002 + n * 0.0001 + 0.0005
        assert r.updates == 200 and r.error is None
        assert r.updates_per_s == pytest.approx(1 / round_s, rel=1e-6)
        assert set(r.steps.values()) == {200} and not r.staleness.any() and r.drops == 0


def test_latency_waits_on_no_core_and_is_in_every_pull_and_push():
    """A call's latency holds no CPU: one worker on one shared core takes pull, compute and
    push plus two latencies per step, and each recorded pull and push holds one latency."""
    lat, one_core = 0.003, Costs(compute_s=0.004, serve_s=0.002, latency_s=0.003, cores=1)
    for mode in ("async", "sync"):
        r = simulate(cfg(workers=1, mode=mode), one_core)
        assert r.updates_per_s == pytest.approx(1 / (0.004 + 0.002 + 2 * lat), rel=1e-3)
        assert np.allclose(r.pulls, 0.001 + lat) and np.allclose(r.pushes, 0.001 + lat)
    # two workers on one core: a worker's latency overlaps the other's CPU (were it held on
    # the core, two would go no faster than one); the CPU's 6 ms a step is the ceiling
    one = 1 / (0.004 + 0.002 + 2 * lat)
    r = simulate(cfg(workers=2, mode="async", steps=400), one_core)
    assert 1.5 * one < r.updates_per_s <= 1 / 0.006 * 1.001
    assert simulate(cfg(workers=2, mode="async"), FIXED).pulls.size == 0  # one event a step


def test_async_is_bound_by_the_workers_or_by_one_ps():
    step_s = 0.001 + 0.004 + 0.002 + 0.0005
    for n in (1, 2, 4):  # the PS is idle most of the time: N steps per step time
        r = simulate(cfg(workers=n, mode="async", steps=2000), FIXED)
        assert r.updates_per_s == pytest.approx(n / step_s, rel=0.02)
    # the PS applies one update at a time: past 1 / apply_s it is the bottleneck (the knee),
    # and P tasks share each apply
    slow_ps = Costs(compute_s=0.004, apply_s=0.002)
    for ps in (1, 2):
        r = simulate(cfg(workers=16, mode="async", steps=2000), slow_ps, ps=ps)
        assert r.updates_per_s == pytest.approx(ps / 0.002, rel=0.02)


def test_async_staleness_is_the_updates_between_read_and_apply():
    """N identical workers in lockstep read the same version; the i-th push of a round is
    applied after i others: staleness 0 to N - 1, mean (N - 1) / 2."""
    r = simulate(cfg(workers=5, mode="async", steps=1000), Costs(compute_s=0.004))
    assert sorted(set(r.staleness.tolist())) == [0, 1, 2, 3, 4]
    assert r.mean_staleness == pytest.approx(2.0)


def test_backup_applies_k_fresh_and_drops_or_folds_the_rest():
    for stale in ("drop", "fold"):
        r = simulate(cfg(workers=4, mode="backup", k=3, stale=stale), FIXED)
        late = r.drops if stale == "drop" else r.folded
        pushes = sum(r.steps.values())
        # every push counted once: k fresh per update, the late ones, and those the end cut
        assert 3 * r.updates + late <= pushes <= 3 * r.updates + late + 4
        assert late >= r.updates - 1  # the slowest of 4 misses every update but the first
        if stale == "drop":
            assert not r.staleness.any()
        else:
            assert r.staleness.max() == 1


def test_a_straggler_slows_sync_and_backup_workers_hide_it():
    slow = {"1": 4.0}  # worker 1's steps take 4x as long
    sync = simulate(cfg(workers=4, mode="sync", stragglers=slow), FIXED)
    backup = simulate(cfg(workers=4, mode="backup", k=3, stragglers=slow), FIXED)
    plain = simulate(cfg(workers=4, mode="sync"), FIXED)
    # every update waits for the straggler, which sleeps its delay after pushing (as
    # worker.py does: in sync the factor stretches its compute and push, 6 ms, into 4x): a
    # round is its pull and 4x that
    round_s = 0.001 + 4 * (0.004 + 0.002)
    # (the first round decides on all four pushes at once; later, the others' come earlier)
    assert np.diff(sync.update_t)[1:].tolist() == pytest.approx([round_s] * 198)
    assert backup.updates_per_s > 0.9 * plain.updates_per_s
    assert backup.steps[1] < backup.steps[0] / 2


def test_ssp_stays_within_its_bound_and_beats_sync_with_a_straggler():
    slow = {"0": 3.0}
    ssp = simulate(cfg(workers=4, mode="ssp", staleness=2, stragglers=slow), FIXED)
    sync = simulate(cfg(workers=4, mode="sync", stragglers=slow), FIXED)
    assert ssp.updates_per_s > sync.updates_per_s
    # no worker gets more than s + 1 steps ahead of the straggler
    assert max(ssp.steps.values()) - ssp.steps[0] <= 2 + 1


def test_faults_end_sync_and_not_async_or_backup():
    kill = {"2": {"kind": "kill", "at": 5}}
    r = simulate(cfg(workers=3, mode="sync", faults=kill), FIXED)
    assert r.error and "worker 2 died" in r.error and r.updates < 200
    for mode, extra in (("async", {}), ("backup", {"k": 2}), ("ssp", {"staleness": 1})):
        r = simulate(cfg(workers=3, mode=mode, faults=kill, **extra), FIXED)
        assert r.error is None and r.updates == 200 and r.dead == [2], mode
        assert r.steps[2] == 5


def test_a_run_whose_workers_all_die_ends_saying_so():
    kill = {str(w): {"kind": "kill", "at": 3} for w in range(2)}
    for mode in ("async", "ssp"):
        r = simulate(cfg(workers=2, mode=mode, faults=kill), FIXED)
        assert r.error == "every worker died before update 200" and r.updates < 200


def test_one_ps_applies_on_a_shared_core_too():
    """async on one core: compute and the PS's apply take turns (4 ms each)."""
    costs = Costs(compute_s=0.004, apply_s=0.004, cores=1)
    for ps in (1, 2):
        r = simulate(cfg(workers=4, mode="async", steps=500), costs, ps=ps)
        assert r.updates_per_s == pytest.approx(1 / 0.008, rel=0.02), ps


def test_shared_cores_cap_the_throughput():
    """4 workers on 1 core compute one at a time; with a core each they do not."""
    costs = Costs(compute_s=0.004, cores=1)
    r = simulate(cfg(workers=4, mode="async", steps=1000), costs)
    assert r.updates_per_s == pytest.approx(1 / 0.004, rel=0.02)
    free = simulate(cfg(workers=4, mode="async", steps=1000), Costs(compute_s=0.004))
    assert free.updates_per_s == pytest.approx(4 / 0.004, rel=0.02)


def test_the_same_seed_gives_the_same_run_and_noise_keeps_its_mean():
    noisy = Costs(compute_s=0.004, compute_cv=0.5)
    c = cfg(
        workers=3,
        mode="async",
        steps=3000,
        stragglers={"1": {"dist": "exponential", "mean": 0.002}},
    )
    a, b, other = simulate(c, noisy, seed=1), simulate(c, noisy, seed=1), simulate(c, noisy, seed=2)
    assert a.update_t.tolist() == b.update_t.tolist() and a.steps == b.steps
    assert a.update_t.tolist() != other.update_t.tolist()
    # lognormal noise with the mean kept: about the noiseless rate (worker 1 also sleeps)
    expected = 2 / 0.004 + 1 / 0.006
    assert a.updates_per_s == pytest.approx(expected, rel=0.05)


def test_checkpoints_cost_their_time_where_the_engine_waits_for_them():
    """sync: PS task 0's loop writes after an update, with the tokens already out, so a write
    shorter than a round is hidden but one longer holds the next update back by the rest; async:
    the pushes past a checkpoint wait for it (the engine's ticket blocks)."""
    base = simulate(cfg(workers=2, mode="sync", steps=100), FIXED).seconds
    round_s = base / 100
    for write_s in (0.5 * round_s, 3 * round_s):
        c = cfg(workers=2, mode="sync", steps=100, checkpoint_every=10)
        r = simulate(c, Costs(**{**FIXED.__dict__, "checkpoint_s": write_s}))
        assert r.checkpoints == 9  # at 10, 20, ..., 90: not at the run's end
        extra = 9 * max(0.0, write_s - (round_s - 0.001 - 0.0005))  # pull and its wait overlap
        assert r.seconds == pytest.approx(base + extra, rel=0.02), write_s
    one = Costs(compute_s=0.004, checkpoint_s=0.01)
    c = cfg(workers=1, mode="async", steps=100, checkpoint_every=25)
    r = simulate(c, one)
    assert r.checkpoints == 3
    assert r.seconds == pytest.approx(100 * 0.004 + 3 * (0.01 - 0.004), rel=1e-6)


def test_a_killed_ps_is_resumed_from_its_last_checkpoint_after_the_restart():
    """The run fails at the PS's fault and resumes from its last checkpoint: the updates since
    are made again, the restart's seconds are added, and the run still reaches its steps."""
    costs = Costs(compute_s=0.004, restart_s=2.0)
    plain = simulate(cfg(workers=2, mode="sync", steps=100), costs)
    for every, back in ((20, 40), (0, 0), (45, 45)):
        c = cfg(
            workers=2,
            mode="sync",
            steps=100,
            checkpoint_every=every,
            faults={"ps": {"kind": "kill", "at": 45 if every == 45 else 55}},
        )
        r = simulate(c, costs)
        died = 45 if every == 45 else 55
        assert r.updates == 100 and r.error is None
        assert r.restarts[0][1:] == (died, back) and r.lost == died - back
        assert len(r.update_t) == 100 + r.lost
        per_update = plain.seconds / 100
        assert r.seconds == pytest.approx(plain.seconds + 2.0 + r.lost * per_update, rel=0.01)
    # a worker's fault was the first attempt's: the resumed run has every worker
    c = cfg(
        workers=3,
        mode="async",
        steps=300,
        checkpoint_every=50,
        faults={"ps": {"kind": "kill", "at": 120}, "2": {"kind": "kill", "at": 10}},
    )
    r = simulate(c, costs)
    assert r.dead == [2] and r.updates == 300 and r.lost == 20 and r.steps[2] > 10


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"ps": 0}, "ps must be an integer >= 1, got 0"),
        ({"cfg": {"resume": True, "run_id": "r"}}, "resume=True continues a real run"),
        (
            {"cfg": {"faults": {"ps": {"kind": "hang", "at": 5}}}},
            r"fault 'ps': a hung PS is not simulated .*'kind': 'kill', 'at': 5",
        ),
    ],
)
def test_bad_input_is_refused_by_name(kwargs, named):
    c = cfg(workers=2, mode="sync", **kwargs.pop("cfg", {}))
    with pytest.raises(ValueError, match=named):
        simulate(c, FIXED, **kwargs)


@pytest.mark.parametrize(
    "field,value",
    [
        ("compute_s", -1.0),
        ("pull_s", math.nan),
        ("latency_s", -0.001),
        ("cores", 0),
        ("compute_s", {1: "x"}),
    ],
)
def test_bad_costs_are_refused_by_name(field, value):
    args = {"compute_s": 0.001, field: value}
    with pytest.raises(ValueError, match=f"Costs.{field}"):
        Costs(**args)


def test_a_worker_without_a_compute_time_is_named():
    costs = Costs(compute_s={0: 0.004, 1: 0.004})
    with pytest.raises(ValueError, match="no time for worker 2"):
        simulate(cfg(workers=3, mode="async"), costs)


def _calls(path: Path) -> set[str]:
    """`protocol.X` names a module uses (attribute reads of the protocol module)."""
    tree = ast.parse(path.read_text())
    return {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "protocol"
    }


@pytest.mark.parametrize("module", ["helpers/cluster/ps.py", "helpers/sim/attempt.py"])
def test_the_engine_and_the_simulator_share_the_protocols_rules(module):
    """Both follow protocol's SSP gate, backup choice (with its fold weights) and owed tokens;
    neither writes its own: no function of those names, no power (the fold's decay), no min
    over workers' clocks."""
    path = ROOT / module
    used = _calls(path)
    assert {"SSPGate", "BackupAggregator", "OwedTokens", "staleness"} <= used, used
    tree = ast.parse(path.read_text())
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    rules = {"ssp_may_step", "ssp_grants", "fold_weights", "offer", "SSPGate", "BackupAggregator"}
    assert not own & rules, own & rules
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)]
    mins = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", "") == "min"
        and "clock" in ast.unparse(n)
    ]
    assert not mins, mins
