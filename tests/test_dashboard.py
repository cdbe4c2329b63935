"""The dashboard's reading of a run, and a step's phases, on hand-made event sequences.

Real runs' logs are checked against the dashboard, the timeline and the Chrome trace in
tests/test_cluster_integration.py (check_views); these cases pin down each rule on its own.
"""

import ast
import inspect
import itertools
import textwrap

import pytest

from helpers.cluster import protocol
from helpers.cluster.dashboard import Dashboard, render_html
from helpers.cluster.events import Kind, StepStamps
from helpers.cluster.runstate import MAX_POINTS, RunState, _thin


def cfg(**kw):
    return protocol.validate(protocol.RunConfig(**{"workers": 2, "steps": 10, **kw}))


def step(w, s, t, version_read, **kw):
    return {
        "kind": Kind.STEP,
        "t": t,
        "worker": w,
        "step": s,
        "version_read": version_read,
        "pushed": True,
        **kw,
    }


def update(t, version, workers, fresh=None, weights=None):
    return {
        "kind": Kind.UPDATE,
        "t": t,
        "version": version,
        "workers": workers,
        "fresh": fresh or [True] * len(workers),
        "weights": weights or [1.0] * len(workers),
    }


START = [{"kind": Kind.START, "t": 0.0, "version": 0}, {"kind": Kind.JOINED, "t": 1.0}]


def test_sync_worker_waits_from_its_push_until_the_version_passes_what_it_read():
    state = RunState(cfg(mode="sync"))
    state.feed(START + [step(0, 0, 1.1, 0)])
    assert state.doing(0, 1.1) == "waiting for a token"  # pushed; no update yet
    assert state.doing(1, 1.1) == "computing"  # still on its first step
    state.feed([step(1, 0, 1.2, 0), update(1.25, 1, [0, 1])])
    assert state.doing(0, 1.3) == state.doing(1, 1.3) == "computing"
    assert state.frame(1.3)["ps"]["pending pushes"] == 0


def test_ssp_worker_waits_while_more_than_s_ahead_of_the_slowest_live_clock():
    state = RunState(cfg(mode="ssp", staleness=1))
    state.feed(
        START + [step(0, 0, 1.1, 0), update(1.11, 1, [0]), step(0, 1, 1.2, 1), update(1.21, 2, [0])]
    )
    # worker 0 has pushed 2 steps, worker 1 none: 2 - 0 > 1
    assert state.doing(0, 1.2) == "waiting for a token"
    state.feed([step(1, 0, 1.3, 0), update(1.31, 3, [1])])
    assert state.doing(0, 1.3) == "computing"  # 2 - 1 <= 1
    assert state.bound_points[-1][1] == 1 + 1  # the slowest live clock + s
    state.feed([{"kind": Kind.DEAD, "t": 1.4, "worker": 1}])
    assert state.doing(1, 1.4) == "dead"  # and the slowest live clock is now worker 0's


def test_ssp_waiting_is_the_protocols_gate_for_every_clock():
    for s in (0, 1, 2):
        # the PS's clocks of workers 0, 1, 2 (pushes applied), and how far worker 0 is ahead
        for *clocks, ahead in itertools.product(range(4), range(4), range(4), range(3)):
            state = RunState(cfg(mode="ssp", workers=3, staleness=s))
            state.feed(START)
            for w, c in enumerate(clocks):
                state.ps_clock[w] = state.workers[w].clock = c
                state.workers[w].last_t = 1.0
            state.workers[0].clock += ahead
            gate = protocol.ssp_may_step(clocks[0] + ahead, clocks, s)
            waiting = state.doing(0, 1.0) == "waiting for a token"
            assert waiting is not gate, (s, clocks, ahead)


def test_runstate_calls_the_protocols_ssp_gate_instead_of_a_copy_of_it():
    """A copy of the rule could drift from the one the PS grants by; the test above cannot
    tell a faithful copy from a call, so read the code: one call, no comparison of its own."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(RunState.doing)))
    calls = [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    compares = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert "protocol.ssp_may_step" in calls
    assert [c for c in compares if "bound" in c or "min(" in c] == []


def test_async_never_waits_and_a_silent_worker_looks_hung():
    state = RunState(cfg(mode="async"))
    state.feed(START + [step(0, s, 1.0 + 0.01 * s, s) for s in range(5)])
    assert state.doing(0, 1.05) == "computing"
    assert state.doing(0, 1.04 + 3.0) == "silent (hung?)"  # 2 s and 10 median steps
    assert state.doing(1, 1.05) == "computing"  # its first step, since the workers joined
    assert state.doing(1, 4.0) == "silent (hung?)"
    state.stopped = {0}
    assert state.doing(0, 4.0) == "stopped"
    assert state.frame(1.05)["ps"]["pending pushes"] is None


def test_backup_counts_drops_folds_and_the_final_frame():
    state = RunState(cfg(mode="backup", k=1, stale="fold"))
    state.feed(
        START
        + [
            step(0, 0, 1.1, 0),
            update(1.11, 1, [0]),
            step(1, 0, 1.2, 0),
            {"kind": Kind.DROP, "t": 1.21, "worker": 1},
            step(0, 1, 1.3, 1),
            update(1.31, 2, [0, 1], fresh=[True, False], weights=[1.0, 0.25]),
            {"kind": Kind.FINAL, "t": 2.0, "version": 2},
        ]
    )
    frame = state.frame()
    assert frame["finished"] and frame["ps"]["drops"] == 1 and frame["ps"]["folds"] == 1
    assert [r["doing"] for r in frame["workers"]] == ["done", "done"]
    assert frame["ps"]["updates/s"] == pytest.approx(2 / (2.0 - 1.0))  # over the whole run
    page = render_html(state)
    assert "labs-dashboard-final" in page and "1 folded" in page and "<script" not in page


def test_step_phases_are_ordered_and_a_step_that_does_not_push_has_no_push():
    stamps = StepStamps(
        waiting=1.0,
        called=1.0,
        reached=1.1,
        granted=1.5,
        arrived=1.6,
        computed=1.7,
        pushed=1.9,
        returned=2.0,
    )
    assert [(p, round(a, 2), round(b, 2)) for p, a, b in stamps.phases()] == [
        ("pull", 1.0, 1.1),
        ("wait", 1.1, 1.5),
        ("pull", 1.5, 1.6),
        ("compute", 1.6, 1.7),
        ("push", 1.7, 2.0),
    ]
    local = stamps._replace(pushed=1.7)  # Downpour: accumulated, not pushed
    assert [p for p, _, _ in local.phases()] == ["pull", "wait", "pull", "compute"]
    assert local.phases()[-1][2] == 2.0


def test_the_last_step_bar_adds_both_halves_of_a_pull():
    state = RunState(cfg(mode="sync"))
    stamps = [1.0, 1.0, 1.1, 1.5, 1.6, 1.7, 1.9, 2.0]  # StepStamps, as a worker logs them
    state.feed(START + [step(0, 0, 2.0, 0, stamps=stamps, delay_s=0.25)])
    phases = state.workers[0].phases
    assert phases["pull"] == pytest.approx(0.1 + 0.1) and phases["wait"] == pytest.approx(0.4)
    assert phases["delay"] == 0.25 and sum(phases.values()) == pytest.approx(1.25)


def test_bad_dashboard_style_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("LABS_DASHBOARD", "fancy")
    with pytest.raises(ValueError, match="got 'fancy' \\(from LABS_DASHBOARD"):
        Dashboard(cfg())


def test_thinning_keeps_the_newest_points():
    points = [(float(i), i) for i in range(MAX_POINTS + 1)]
    thinned = _thin(points)
    assert len(thinned) < len(points) and thinned[-MAX_POINTS // 2 :] == points[-MAX_POINTS // 2 :]
