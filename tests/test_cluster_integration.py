"""Real clusters of OS processes: each mode trains, invariants hold in the event logs, faults
are reported, and nothing is left running or listening.

Sizes are small (logistic regression on a 6,000-image MNIST subset, 150 PS updates) so that
the whole file runs in a few minutes on 2 cores; clusters are reused across tests. The tests of
the shared cluster run twice: with one PS task, and with the parameters sharded over two.
"""

import _thread
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pandas as pd
import psutil
import pytest

from helpers.cluster import ClusterError, LocalCluster, protocol, timeline, wire
from helpers.cluster.dashboard import render_html
from helpers.cluster.events import StepStamps
from helpers.cluster.runstate import RunState
from helpers.system import netns
from helpers.system.processes import hang, log_tail
from helpers.training import compression
from tests.process_cleanup import end_parent_and_pids

# starts real TF clusters of OS processes: `make unit` leaves it out
pytestmark = pytest.mark.slow

STEPS = 150
MIN_ACCURACY = 0.78  # logistic regression reaches ~0.85 on this subset in 150 updates
# lr 0.2, not larger: at lr 0.5 the last iterate swings from 0.58 to 0.86 between identical
# SSP runs (measured 10 runs); at 0.2 it stays within 0.84-0.85 (8 runs)
COMMON = dict(
    steps=STEPS, batch_size=64, lr=0.2, train_size=6000, test_size=2000, progress=False, seed=0
)


THREE = dict(workers=3, worker_ids=[0, 1, 2])  # the mode tests; worker 3 is spare for faults


@pytest.fixture(scope="module", params=[1, 2], ids=["ps1", "ps2"])
def cluster(shared_data, request):
    with LocalCluster(workers=4, isolate="auto", ps=request.param) as c:
        yield c


SYNC_FINAL = {}  # PS tasks -> the final parameters of the sync test's run


def updates(run):
    ev = run.events
    return ev[ev.kind == "update"]


def steps_of(run):
    ev = run.events
    return ev[ev.kind == "step"]


def check_views(run, tmp_path):
    """The dashboard's state, the timeline and the Chrome trace agree with the event log."""
    ev = run.events
    st, up = steps_of(run), updates(run)
    # the dashboard, fed the events one at a time as they were written
    state = RunState(run.config)
    waiting = []  # (worker, time): the dashboard said it waits for a token at that moment
    for e in ev.drop(columns="source").to_dict("records"):
        e = {k: v for k, v in e.items() if not (np.isscalar(v) and pd.isna(v))}
        state.feed([e])
        waiting += [
            (w, e["t"]) for w in state.workers if state.doing(w, e["t"]) == "waiting for a token"
        ]
    frame = state.frame()
    assert frame["finished"] and frame["ps"]["updates"] == len(up) == run.config.steps
    assert frame["ps"]["drops"] == (ev.kind == "drop").sum()
    assert {r["worker"]: r["clock"] for r in frame["workers"]} == (
        st.groupby("worker").step.max() + 1
    ).to_dict()
    if run.config.mode in ("sync", "ssp", "backup"):
        assert waiting, "a waiting mode with a straggler or a barrier shows waits"
    # a worker said to wait really did: the PS granted its next step only after that moment
    granted = {(int(e.worker), int(e.step)): StepStamps(*e.stamps).granted for e in st.itertuples()}
    clock_at = {}
    for w, t in waiting:
        done = st[(st.worker == w) & (st.t <= t)].step.max()
        nxt = (w, int(done) + 1 if not pd.isna(done) else 0)
        if nxt in granted:
            clock_at[nxt] = min(clock_at.get(nxt, t), t)
    late = [
        (k, g - clock_at[k]) for k, g in granted.items() if k in clock_at and g < clock_at[k] - 1e-3
    ]
    assert not late, f"granted before the dashboard's wait ended: {late[:5]}"
    # the timeline: every step has its compute phase; a worker's phases never overlap
    sp = timeline.spans(ev)
    assert len(sp[sp.phase == "compute"]) == len(st)
    for w, mine in sp.groupby("worker"):
        mine = mine.sort_values("start")
        assert (mine.start.to_numpy()[1:] >= mine.end.to_numpy()[:-1] - 1e-6).all(), w
    # the Chrome trace, loaded back
    trace = json.loads(run.to_chrome_trace(tmp_path / "run.trace.json").read_text())
    names = {
        e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"
    }
    for w in run.config.worker_ids:
        assert names[w + 1] == f"worker {w}"
        mine = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == w + 1]
        assert sum(e["name"] == "compute" for e in mine) == (st.worker == w).sum()
        assert all(e["ts"] >= 0 and e["dur"] > 0 for e in mine)
    assert sum(e["ph"] == "i" and e["name"] == "update" for e in trace["traceEvents"]) == len(up)
    return state


def test_async_downpour_trains_and_records_staleness(cluster, tmp_path):
    # async has no bound on staleness: on a busy machine one worker can be starved and push
    # a gradient 100+ versions old at the very end (0.64 measured beside a notebook run), so
    # the bar is "it learned" (chance is 0.1); sync and backup below must reach 0.78
    run = cluster.train(mode="async", n_fetch=2, n_push=2, **THREE, **COMMON)
    assert run.test_accuracy > 0.4
    up, st = updates(run), steps_of(run)
    assert len(up) == STEPS and up.version.tolist() == list(range(1, STEPS + 1))
    for _, row in up.iterrows():  # staleness = updates between the pull and this apply
        assert row.staleness == [row.version - 1 - v for v in row.versions]
    for _, rows in st.groupby("worker"):  # Downpour schedule, replayed from the protocol
        rows = rows.sort_values("step")
        d = protocol.Downpour(2, 2)
        assert rows.fetched.tolist() == [d.fetch(s) for s in rows.step]
        assert rows.pushed.tolist() == [d.accumulate() for _ in rows.step]
        assert (rows.bytes_pulled > 0).tolist() == rows.fetched.tolist()
    summary = run.summary()
    assert summary["ps_updates"] == STEPS and summary["staleness_max"] >= 0
    if cluster.isolated:  # the wire carries at least the tensor payload counted by the nodes
        assert summary["loopback_bytes"] >= summary["bytes_pushed"] + summary["bytes_pulled"]
    assert set(summary["resources"]) >= {"ps:0", "worker:0"}
    state = check_views(run, tmp_path)
    assert state.frame()["ps"]["pending pushes"] is None  # async applies in the worker's call


def test_async_workers_apply_under_numbered_tickets_with_schedule_momentum_and_checkpoints(cluster):
    """async: the workers apply their own gradients on the PS; the PS's tickets number every
    update once, give it the schedule's learning rate, and stop at each checkpoint."""
    schedule = {"name": "piecewise", "boundaries": [50, 100], "values": [0.1, 0.05, 0.02]}
    run = cluster.train(
        mode="async", lr_schedule=schedule, momentum=0.5, checkpoint_every=25, **THREE, **COMMON
    )
    assert run.test_accuracy > MIN_ACCURACY
    up = updates(run)
    assert up.version.tolist() == list(range(1, STEPS + 1))
    assert up.lr.tolist() == pytest.approx(
        [protocol.learning_rate(COMMON["lr"], schedule, v - 1) for v in up.version]
    )
    assert set(w for row in up.workers for w in row) == {0, 1, 2}
    ev = run.events
    ps = ev[ev.source == "ps-0"].reset_index(drop=True)
    ckpts = ps[ps.kind == "checkpoint"]
    assert ckpts.version.tolist() == list(range(25, STEPS + 1, 25))
    for i, row in ckpts.iterrows():  # written once exactly `version` updates were applied
        assert (ps.loc[:i].kind == "update").sum() == row.version
    # a step is logged once its call returned, i.e. once its gradient was applied: the pushed
    # steps and the updates are the same (worker, step) pairs, each once
    st = steps_of(run)
    pushed = sorted(zip(st[st.pushed].worker.astype(int), st[st.pushed].step.astype(int)))
    assert pushed == sorted((row.workers[0], row.steps[0]) for row in up.itertuples())


def test_sync_averages_exactly_n_gradients_of_the_current_version(cluster, tmp_path):
    run = cluster.train(mode="sync", checkpoint_every=STEPS, **THREE, **COMMON)
    assert run.test_accuracy > MIN_ACCURACY
    # sync is deterministic: sharded or not, the same updates give the same parameters
    with np.load(run.dir / "ckpt" / f"ckpt-{STEPS:07d}.npz") as f:
        SYNC_FINAL[cluster.n_ps] = [f[k] for k in sorted(f.files)]
    # the first cluster's run in this session (run alone, a run is compared with itself)
    first = next(iter(SYNC_FINAL.values()))
    for one, two in zip(first, SYNC_FINAL[cluster.n_ps]):
        np.testing.assert_allclose(one, two, rtol=0, atol=1e-6)
    up = updates(run)
    assert len(up) == STEPS
    for _, row in up.iterrows():
        assert sorted(row.workers) == [0, 1, 2]
        assert row.versions == [row.version - 1] * 3
        assert row.weights == pytest.approx([1 / 3] * 3)
    # every worker waited for each new version: one step per worker per update
    assert steps_of(run).groupby("worker").size().tolist() == [STEPS] * 3
    assert check_views(run, tmp_path).frame()["ps"]["pending pushes"] == 0


def test_ssp_gap_never_exceeds_staleness(cluster, tmp_path):
    s = 1
    run = cluster.train(mode="ssp", staleness=s, stragglers={2: 3.0}, **THREE, **COMMON)
    st = steps_of(run)
    # SSP bounds the workers' clocks, not the gradients' staleness (up to 7 updates here), so
    # the last iterate's accuracy has a tail under load: with two PS tasks, 0.850-0.858 in 39
    # runs (33 beside CPU hogs), 0.82-0.855 in 12 runs whose nodes were paused at random
    # (SIGSTOP, 20-400 ms), and 0.7795 once in CI. The bar is "it learned": accuracy far
    # above chance (0.1), and the training loss of its last 20 steps far below chance's (2.3)
    last = st.sort_values("t").loss.tail(20).mean()
    assert run.test_accuracy > 0.6 and last < 1.0, (run.test_accuracy, last)
    assert st.gap.max() <= s
    assert st.gap.max() == s  # with a 3x straggler the fast workers do run ahead
    assert len(updates(run)) == STEPS
    state = check_views(run, tmp_path)
    assert state.bound == s and state.bound_points  # the live plot draws the bound
    assert "slowest + s" in render_html(state) and "<script" not in render_html(state)


def test_backup_fold_uses_k_fresh_and_decaying_stale_weights(cluster, tmp_path):
    k, decay = 2, 0.5
    run = cluster.train(
        mode="backup", k=k, stale="fold", decay=decay, stragglers={2: 3.0}, **THREE, **COMMON
    )
    assert run.test_accuracy > MIN_ACCURACY
    folded = 0
    for _, row in updates(run).iterrows():
        fresh = [i for i, f in enumerate(row.fresh) if f]
        stale = [i for i, f in enumerate(row.fresh) if not f]
        assert len(fresh) == k
        assert all(row.versions[i] == row.version - 1 for i in fresh)
        assert all(row.weights[i] == pytest.approx(1 / k) for i in fresh)
        ages = [row.version - 1 - row.versions[i] for i in stale]
        expected = protocol.fold_weights(ages, 1.0, decay, 0.5)
        assert [row.weights[i] for i in stale] == pytest.approx(expected)
        assert sum(row.weights[i] for i in stale) <= 0.5 + 1e-9
        folded += len(stale)
    assert folded > 0, "the 3x straggler should have produced late gradients to fold"
    assert check_views(run, tmp_path).frame()["ps"]["folds"] == folded


def test_backup_drop_discards_late_gradients(cluster, tmp_path):
    run = cluster.train(
        mode="backup",
        k=2,
        stale="drop",
        stragglers={2: 3.0},
        checkpoint_every=10,
        **THREE,
        **COMMON,
    )
    assert run.test_accuracy > MIN_ACCURACY
    for _, row in updates(run).iterrows():
        assert row.fresh == [True, True] and row.versions == [row.version - 1] * 2
    drops = run.events[run.events.kind == "drop"]
    assert len(drops) > 0 and (drops.staleness >= 1).all()
    assert run.summary()["dropped"] == len(drops)
    check_views(run, tmp_path)
    marks = timeline.marks(run.events)
    assert (marks.kind == "drop").sum() == len(drops) and (marks.kind == "checkpoint").any()
    # one checkpoint per 10 updates, each written once: the pushes that arrive between two
    # updates (a dropped one, or the first of the next k) must not write it again
    ckpts = run.events[run.events.kind == "checkpoint"]
    assert ckpts.version.astype(int).tolist() == list(range(10, STEPS + 1, 10))


def test_compressed_pushes_send_fewer_bytes_and_still_train(cluster):
    """float16 halves a push; top-1% sends 1% of entries as value + int32 index (of each
    piece: sharded over 2 tasks, of each half of the weights)."""
    logreg = [(784, 10), (10,)]  # the gradient shapes of logistic regression on MNIST
    pieces = [p.shape for p in wire.plan(logreg, cluster.n_ps)]
    top = {1: 79 + 1, 2: 40 + 40 + 1}[cluster.n_ps]  # ceil(1% of 7840), or of 3920 twice; bias 1
    plain = cluster.train(mode="sync", **THREE, **COMMON)
    for spec, payload in (("float16", 2 * 7850), ({"topk": 0.01}, 8 * top)):
        run = cluster.train(mode="sync", compress=spec, **THREE, **COMMON)
        assert run.test_accuracy > MIN_ACCURACY, spec
        pushed = steps_of(run).bytes_pushed
        assert set(pushed) == {payload + 32}, spec  # + the int64[4] header
        assert compression.from_spec(spec).bytes_for(pieces) == payload
        if cluster.isolated:  # the network really carried less: pulls are unchanged
            saved = plain.summary()["bytes_pushed"] - run.summary()["bytes_pushed"]
            assert plain.summary()["loopback_bytes"] - run.summary()["loopback_bytes"] > saved / 2


def test_logreg_trains_on_dbpedia_features_from_a_file(cluster, shared_data, tmp_path, monkeypatch):
    """data= an .npz of features: here hashed bag-of-words of real DBpedia articles."""
    from sklearn.feature_extraction.text import HashingVectorizer

    from helpers.data.dbpedia import load_dbpedia

    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
    vec = HashingVectorizer(n_features=1024, alternate_sign=False, norm="l2")
    parts = {}
    for split, n in (("train", 150), ("test", 40)):
        df = load_dbpedia(split, n_per_class=n, seed=0)
        parts[f"x_{split}"] = vec.transform(df.title + " " + df.content).toarray().astype("float32")
        parts[f"y_{split}"] = df.label.to_numpy()
    path = tmp_path / "dbpedia_features.npz"
    np.savez(path, **parts)
    run = cluster.train(
        mode="sync",
        data=str(path),
        **THREE,
        **dict(COMMON, lr=1.0, train_size=None, test_size=None),
    )
    assert run.test_accuracy > 0.5  # 14 classes: chance is 0.07; 0.71 measured
    assert set(steps_of(run).bytes_pulled) == {4 * (1024 * 14 + 14)}  # a 1024 -> 14 layer


def test_random_straggler_delays_are_seeded_and_the_live_view_runs(cluster, capsys):
    spec = {2: {"dist": "exponential", "mean": 0.005}}
    runs, lasts = [], []
    for live in ("text", True):  # outside a kernel, True draws text too
        runs.append(
            cluster.train(
                mode="sync", stragglers=spec, **THREE, **dict(COMMON, steps=20, progress=live)
            )
        )
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[sync")]
        lasts.append(lines[-1] if lines else "")
    delays = [steps_of(r).query("worker == 2").sort_values("step").delay_s.tolist() for r in runs]
    assert delays[0] == delays[1] and len(delays[0]) == 20 and min(delays[0]) > 0
    assert steps_of(runs[0]).query("worker == 0").delay_s.eq(0).all()
    # the dashboard's text lines: the last of each run is its final state (a frame drawn
    # between the last update and the PS's final event may show v20 too)
    assert all("PS v20 (20/20" in line and "w2 20 done" in line for line in lasts), lasts
    # the timeline shows each delay where the worker slept it
    sp = timeline.spans(runs[0].events)
    slept = sp[sp.phase == "delay"]
    assert set(slept.worker) == {2}
    assert (slept.end - slept.start).sum() == pytest.approx(sum(delays[0]))
    # the per-phase table holds the same seconds, and the shares are its rows over their sums
    seconds = timeline.phase_seconds(runs[0].events)
    assert seconds.loc[2, "delay"] == pytest.approx(sum(delays[0]))
    assert (seconds.loc[[0, 1], "delay"] == 0).all() and (seconds["compute"] > 0).all()
    shares = timeline.phase_shares(runs[0].events)
    assert np.allclose(shares, seconds.div(seconds.sum(axis=1), axis=0))
    with pytest.raises(
        ValueError, match="progress must be True, False, 'widget' or 'text', got 'yes'"
    ):
        cluster.train(mode="sync", **THREE, **dict(COMMON, progress="yes"))


def test_the_invariants_hold_with_three_ps_tasks(shared_data, tmp_path):
    """P = 3: logistic regression's weights in three pieces, its bias beside one of them; the
    same checks of the event logs, and sync's parameters as with one PS task."""
    with LocalCluster(workers=4, isolate="auto", ps=3) as c:
        assert {p.task for p in wire.plan([(784, 10), (10,)], 3)} == {0, 1, 2}
        test_async_workers_apply_under_numbered_tickets_with_schedule_momentum_and_checkpoints(c)
        test_sync_averages_exactly_n_gradients_of_the_current_version(c, tmp_path)
        test_ssp_gap_never_exceeds_staleness(c, tmp_path)
        test_backup_fold_uses_k_fresh_and_decaying_stale_weights(c, tmp_path)
        test_backup_drop_discards_late_gradients(c, tmp_path)
        # TF's files for the functions the nodes traced: in the cluster's folder, not the
        # machine's temp folder, and gone with the cluster
        # (a forked node's /proc environ is its fork server's: its files are what to look at)
        tmp = c.dir / "tmp"
        assert list(tmp.glob("__autograph_generated_file*.py")), list(tmp.iterdir())
    assert not tmp.exists(), list(tmp.iterdir())


def test_isolated_cluster_listens_on_no_host_port(cluster):
    if not cluster.isolated:
        pytest.skip(
            "unprivileged user namespaces are not permitted on this machine, so the "
            "cluster runs unisolated (LocalCluster warned about it)"
        )
    ports = [
        int(a.rsplit(":")[1]) for a in json.loads((cluster.dir / "cluster.json").read_text())["ps"]
    ]
    assert len(ports) == cluster.n_ps
    # inside the namespace each PS task listens on its port ...
    assert set(ports) <= set(cluster.network.listening_ports())
    # ... while the host namespace has no listening socket of any cluster process
    cluster_pids = set(cluster.pids.values())
    host = [
        c
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in cluster_pids
    ]
    assert host == []
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


def test_not_permitted_isolation_warns_once_or_raises(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no unshare/nsenter to be found
    monkeypatch.setattr(netns, "_WARNED", False)
    with pytest.warns(RuntimeWarning, match="listen on ALL network interfaces"):
        assert netns.PrivateNetwork("auto").start().prefix == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once is enough: the second cluster is quiet
        assert not netns.PrivateNetwork("auto").start().isolated
    with pytest.raises(ClusterError, match="isolate=True but unshare, nsenter, ip not found"):
        LocalCluster(1, isolate=True).start()


def test_async_ssp_and_backup_finish_when_a_worker_is_killed(cluster):
    run = cluster.train(mode="ssp", staleness=1, faults={3: {"kind": "kill", "at": 20}}, **COMMON)
    assert run.dead_workers == [3]
    # this test is about the lost worker; the accuracy only says the run learned. Pushes that
    # queue at PS task 0 raise SSP's staleness and lower the accuracy after 150 updates:
    # sharded (each update a remote call to both tasks) the mean staleness was 4.1-4.7 against
    # 1.0-1.2 on one task, accuracy 0.77-0.83 (10 runs) against 0.83-0.85; on one task beside
    # a grading run in a CI rehearsal, 0.723. Chance is 0.1.
    summary = run.summary()
    assert len(updates(run)) == STEPS and run.test_accuracy > 0.6, (
        run.test_accuracy,
        summary["staleness_mean"],
    )
    st = steps_of(run)
    assert st[st.worker == 3].step.max() < 20 and st.gap.max() <= 1
    run = cluster.train(
        mode="async",
        workers=3,
        worker_ids=[0, 1, 2],
        faults={2: {"kind": "kill", "at": 20}},
        **COMMON,
    )
    assert run.dead_workers == [2] and len(updates(run)) == STEPS  # this run's, not 3 from before
    assert (updates(run).workers.apply(lambda ws: ws[0]) != 2).sum() > STEPS // 2
    run = cluster.train(
        mode="backup",
        k=1,
        workers=2,
        worker_ids=[0, 1],
        faults={1: {"kind": "kill", "at": 20}},
        **COMMON,
    )
    assert run.dead_workers == [1] and len(updates(run)) == STEPS
    assert cluster.dead_workers == {1, 2, 3}  # the cluster remembers them all


def test_log_tail_reads_from_where_the_run_began(tmp_path):
    log = tmp_path / "ps-0.log"
    log.write_text("earlier run: Traceback ...\n")
    start = log.stat().st_size
    with open(log, "a") as f:
        f.write("this run: line 1\nthis run: line 2\n")
    assert log_tail(log, start=start) == "this run: line 1\nthis run: line 2"
    assert log_tail(log, lines=1) == "this run: line 2"
    assert log_tail(tmp_path / "missing.log") == "(no log)"
    assert log_tail(log, start=log.stat().st_size) == "(nothing logged during this run)"


def test_bad_config_raises_before_anything_starts():
    with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
        LocalCluster(workers=0)
    with pytest.raises(ValueError, match="isolate must be"):
        LocalCluster(workers=1, isolate="maybe")
    with pytest.raises(
        ValueError,
        match=r"ps must be an integer >= 1 \(the number of PS "
        r"tasks\), got 0",
    ):
        LocalCluster(workers=1, ps=0)


def test_killed_ps_fails_fast_naming_it(cluster):
    """Last user of the shared cluster: a PS task dies at update 35, after the checkpoint of
    update 30 (the one PS, or the sharded cluster's task 1, which holds half of the
    parameters); async stops handing out tickets at any PS task's fault."""
    pids = list(cluster.pids.values())
    task = cluster.n_ps - 1
    with pytest.raises(
        ValueError,
        match=rf"faults \['ps:{cluster.n_ps}'\] name PS tasks this "
        rf"cluster does not have: it has ps={cluster.n_ps}",
    ):
        missing = f"ps:{cluster.n_ps}"
        cluster.train(mode="sync", faults={missing: {"kind": "kill", "at": 3}}, **COMMON)
    with pytest.raises(ClusterError, match=rf"ps:{task} \(pid \d+\) killed by SIGKILL") as err:
        cluster.train(
            mode="async",
            run_id=f"{cluster.name}-killed",
            checkpoint_every=10,
            faults={f"ps:{task}": {"kind": "kill", "at": 35}},
            **COMMON,
        )
    assert "(this run) ---" in str(err.value)  # the tail starts where this run began
    events = (cluster.dir.parent / f"{cluster.name}-killed" / "ps-0.jsonl").read_text()
    faults = [json.loads(line) for line in events.splitlines() if '"fault"' in line]
    assert [(f["version"], f["ps"]) for f in faults] == [(35, task)]  # once, where it was due
    assert time.time() - faults[0]["t"] < 10  # the error came within 10 s of the death
    assert cluster.procs == {}
    assert not [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def interrupt_when_training(c):
    """Raise KeyboardInterrupt in the main thread once the next run has logged a step.

    interrupt_main() simulates SIGINT, which does nothing if SIGINT is ignored, as it is in
    a process started in the background by a non-interactive shell: the caller installs
    Python's default handler for the duration (see the test).
    """

    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = sorted(c.dir.parent.glob(f"{c.name}-run*/worker-0.jsonl"))
            if runs and '"step"' in runs[-1].read_text():
                _thread.interrupt_main()
                return
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()


def test_resume_from_the_last_checkpoint_with_an_evaluator(cluster):
    run_id = f"{cluster.name}-killed"  # written by the previous test
    ckpt = cluster.dir.parent / run_id / "ckpt"
    assert json.loads((ckpt / "latest.json").read_text())["version"] == 30
    assert not list(ckpt.glob(".*tmp*")), "a half-written checkpoint was left behind"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            # resumed on the other number of PS tasks: checkpoints hold whole variables
            with LocalCluster(workers=1, isolate="auto", evaluator=True, ps=3 - cluster.n_ps) as c:
                run = c.train(
                    mode="async", run_id=run_id, resume=True, checkpoint_every=40, **COMMON
                )
                pids = list(c.pids.values())
                interrupt_when_training(c)  # a Jupyter kernel interrupt during a run
                # bounded, so that a lost interrupt fails the test instead of hanging it
                c.train(mode="sync", **dict(COMMON, steps=20_000))
    finally:
        signal.signal(signal.SIGINT, previous)
    gone = (
        psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=10)[1]
        == []
    )
    assert gone and c.procs == {} and not c.isolated
    ev = run.events
    resumed_at = ev[(ev.kind == "resume")].version.iloc[-1]
    assert resumed_at == 30
    last_start = ev[ev.kind == "start"].index[-1]
    after = ev.loc[last_start:]
    assert after[after.kind == "update"].version.tolist() == list(range(31, STEPS + 1))
    evals = ev[ev.kind == "eval"]
    assert evals.version.tolist() == [40, 80, 120, STEPS]  # every checkpoint, then the final
    assert evals.test_accuracy.iloc[-1] == pytest.approx(run.test_accuracy)
    assert run.test_accuracy > MIN_ACCURACY


def test_a_resumed_run_warms_up_under_start_timeout_not_stall_timeout(shared_data):
    """A resumed run's log begins with the earlier attempt's events, its JOINED among them:
    until the workers join again, nothing is written, and that wait is start_timeout's
    (120 s), not stall_timeout's (here 2 s). The worker is held stopped for 5 s when the
    run begins, so its warm-up outlasts stall_timeout on any machine; the 2 s then bound
    every gap between events once it has joined (about 0.1 s apart on a loaded 2-core box)."""
    stall, held = 2.0, 5.0
    with LocalCluster(workers=1, isolate="auto") as c:
        run_id = f"{c.name}-resume-warmup"
        with pytest.raises(ClusterError, match="ps:0"):
            c.train(
                mode="async", run_id=run_id, checkpoint_every=20,
                faults={"ps": {"kind": "kill", "at": 25}}, **dict(COMMON, steps=60),
            )  # fmt: skip
    with LocalCluster(workers=1, isolate="auto", stall_timeout=stall) as c:
        worker = c.pids["worker:0"]
        hang(worker)  # guarded: it still ends with this process
        release = threading.Timer(held, os.kill, (worker, signal.SIGCONT))
        release.start()
        try:
            run = c.train(
                mode="async", run_id=run_id, resume=True, checkpoint_every=20,
                **dict(COMMON, steps=60),
            )  # fmt: skip
        finally:
            release.cancel()
            if _stopped(worker):
                os.kill(worker, signal.SIGCONT)
    ev = run.events
    assert ev[ev.kind == "resume"].version.tolist() == [20]
    after = ev.loc[ev[ev.kind == "start"].index[-1] :]
    assert after[after.kind == "update"].version.tolist() == list(range(21, 61))
    assert (ev.kind == "joined").sum() == 2  # one an attempt
    warm_up = after[after.kind == "joined"].t.iloc[0] - after.t.iloc[0]
    assert warm_up > stall, f"the warm-up ({warm_up:.1f} s) did not outlast stall_timeout"


@pytest.fixture(scope="module")
def small_cluster(shared_data):
    with LocalCluster(workers=2, isolate="auto", stall_timeout=10) as c:
        yield c


def test_lost_workers_give_clear_errors_in_sync_and_backup(small_cluster):
    with pytest.raises(ClusterError, match="use mode='backup'"):
        small_cluster.train(mode="sync", faults={1: {"kind": "kill", "at": 10}}, **COMMON)
    assert small_cluster.dead_workers == {1}
    with pytest.raises(ValueError, match="k must be between 1 and workers=1"):
        small_cluster.train(mode="backup", k=2, **COMMON)


def test_hung_ps_trips_the_stall_watchdog(small_cluster):
    pids = list(small_cluster.pids.values())
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"no progress for 10 s.*ps:0") as err:
        small_cluster.train(mode="async", faults={"ps": {"kind": "hang", "at": 20}}, **COMMON)
    # the tail starts where this run began: not the previous test's "worker 1 died" traceback
    assert "(this run) ---" in str(err.value) and "died" not in str(err.value)
    assert time.monotonic() - t0 < 120  # a guard against a watchdog that never trips
    assert small_cluster.procs == {}  # torn down
    assert not any(psutil.pid_exists(p) for p in pids)  # the stopped PS included, by PID


ORPHAN_SCRIPT = textwrap.dedent("""
    import json, sys
    from helpers.cluster import LocalCluster
    c = LocalCluster(workers=1, isolate="auto", ps=int(sys.argv[2])).start()
    pids = list(c.pids.values()) + ([c.network.pid] if c.isolated else [])
    pids += [c.nodes.server.pid] if c.nodes.server else []  # the fork server (Linux)
    print(json.dumps(pids), flush=True)
    if sys.argv[1] == "mid-run":  # train until killed: the nodes never look at stdin
        c.train(mode="async", steps=10**6, train_size=6000, test_size=2000, progress=False,
                run_id="orphan-mid-run")
    sys.stdin.read()  # wait to be killed
""")


def _launcher_script(script: str, args: list[str], runs_dir, pdeathsig: str, fork: str = "1"):
    """A parent process running `script` (a LocalCluster's launcher), its runs in `runs_dir`;
    fork="0": its nodes are spawned one by one, not forked from a fork server."""
    env = dict(os.environ, LABS_RUNS_DIR=str(runs_dir), LABS_PDEATHSIG=pdeathsig, LABS_FORK=fork)
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _first_report(parent):
    """The JSON line the launcher script prints once its cluster has started."""
    line = parent.stdout.readline()
    assert line, "the launcher script died before starting its cluster"
    return json.loads(line)


def _updates_so_far(run_dir) -> int:
    try:
        return (run_dir / "ps-0.jsonl").read_text().count('"kind": "update"')
    except OSError:
        return 0


@pytest.mark.parametrize(
    "when, pdeathsig, ps, fork",
    [
        ("idle", "0", 1, "1"),
        ("mid-run", "0", 1, "1"),
        ("idle", "1", 1, "1"),
        ("mid-run", "1", 1, "1"),
        ("mid-run", "0", 2, "1"),
        ("mid-run", "0", 1, "0"),
    ],
    ids=[
        "idle-lifeline-only",
        "mid-run-lifeline-only",
        "idle-with-prctl",
        "mid-run-with-prctl",
        "mid-run-lifeline-only-2ps",
        "mid-run-lifeline-only-spawned",
    ],
)
def test_no_survivors_when_the_launcher_is_sigkilled(
    shared_data, tmp_path, when, pdeathsig, ps, fork
):
    """LABS_PDEATHSIG=0 leaves only the portable lifeline (as on macOS): 0 survivors, idle and
    in the middle of a run; with Linux's prctl as well, the same; and with two PS tasks. The
    nodes are forked from a fork server, and (LABS_FORK=0, as on macOS) spawned one by one."""
    parent = _launcher_script(ORPHAN_SCRIPT, [when, str(ps)], tmp_path, pdeathsig, fork)
    pids = []
    try:
        pids = _first_report(parent)
        assert all(psutil.pid_exists(p) for p in pids)
        if when == "mid-run":  # wait for the run to be well under way
            deadline = time.monotonic() + 120
            while _updates_so_far(tmp_path / "orphan-mid-run") < 20:
                assert time.monotonic() < deadline and parent.poll() is None, "no run started"
                time.sleep(0.2)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        survivors = psutil.wait_procs(
            [psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=20
        )[1]
        assert survivors == [], f"orphans left running: {[p.pid for p in survivors]}"
    finally:
        end_parent_and_pids(parent, pids)  # by PID, whatever the test found


HUNG_SCRIPT = textwrap.dedent("""
    import json, sys
    from helpers.cluster import LocalCluster
    hung = sys.argv[1]  # ps:1: PS task 0 stops task 1, its sibling
    c = LocalCluster(workers=1, isolate="auto", stall_timeout=600, ps=1 + (hung == "ps:1"))
    c.start()
    pids = list(c.pids.values()) + ([c.network.pid] if c.isolated else [])
    pids += [c.nodes.server.pid] if c.nodes.server else []  # the fork server (Linux)
    print(json.dumps({"pids": pids, "hung": c.pids[hung]}), flush=True)
    fault = {"ps:0": "ps", "ps:1": "ps:1", "worker:0": 0}[hung]
    c.train(mode="async", steps=10**6, train_size=6000, test_size=2000, progress=False,
            faults={fault: {"kind": "hang", "at": 10}}, run_id="orphan-hung")
""")


def _stopped(pid) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(
    "hung, pdeathsig, fork",
    [
        ("ps:0", "0", "1"),
        ("ps:0", "1", "1"),
        ("worker:0", "0", "1"),
        ("worker:0", "1", "1"),
        ("ps:1", "0", "1"),
        ("worker:0", "0", "0"),
    ],
    ids=[
        "ps-lifeline-only",
        "ps-with-prctl",
        "worker-lifeline-only",
        "worker-with-prctl",
        "second-ps-lifeline-only",
        "worker-lifeline-only-spawned",
    ],
)
def test_a_hung_node_goes_with_its_sigkilled_launcher(shared_data, tmp_path, hung, pdeathsig, fork):
    """A node stopped by the hang fault runs neither its lifeline watcher nor a SIGTERM: it
    still ends within 10 s of its launcher's SIGKILL, with prctl and with the lifeline alone,
    forked from a fork server or (LABS_FORK=0) spawned."""
    parent = _launcher_script(HUNG_SCRIPT, [hung], tmp_path, pdeathsig, fork)
    pids = []
    try:
        started = _first_report(parent)
        pids = started["pids"]
        deadline = time.monotonic() + 120
        while not _stopped(started["hung"]):
            assert time.monotonic() < deadline and parent.poll() is None, "no hang fault"
            time.sleep(0.2)
        nodes = [psutil.Process(p) for p in pids]
        pids += [c.pid for n in nodes for c in n.children(recursive=True)]  # anything they started
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        survivors = psutil.wait_procs(
            [psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=10
        )[1]
        assert survivors == [], f"left running: {[(p.pid, p.status()) for p in survivors]}"
    finally:
        end_parent_and_pids(parent, pids)  # by PID, whatever the test found


def test_standalone_ps_gives_up_on_silent_workers(tmp_path, shared_data):
    """worker_timeout: a standalone PS whose worker never comes fails with a clear error."""
    reason = netns.unavailable_reason()
    if reason:  # the PS listens on all interfaces: keep it inside a private namespace
        pytest.skip(reason)
    (tmp_path / "cluster.json").write_text(
        json.dumps({"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]})
    )  # no worker will start
    cfg = protocol.validate(
        protocol.RunConfig(workers=1, mode="sync", steps=10, worker_timeout=3, run_id="silent")
    )
    (tmp_path / "run.json").write_text(json.dumps(cfg.to_dict()))
    ps = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--net",
            "sh",
            "-c",
            f"ip link set lo up && exec {sys.executable} -m helpers.cluster.node --cluster "
            f"{tmp_path / 'cluster.json'} --job ps --task 0 --run {tmp_path / 'run.json'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,  # a PS that never gives up fails here (a bound of 60 s on the whole
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),  # run failed on a loaded machine: 63 s)
    )
    assert ps.returncode != 0
    assert "no message from any worker for worker_timeout=3 s (last heard: worker 0" in ps.stderr
    events = (tmp_path / "ps-0.jsonl").read_text()
    assert '"timeout"' in events and '"joined"' not in events


@pytest.mark.parametrize("ps", [1, 2], ids=["ps1", "ps2"])
def test_node_entrypoint_runs_across_two_hosts_joined_by_veth(tmp_path, shared_data, ps):
    """Two network namespaces stand in for two machines; the nodes run standalone. With two
    PS tasks the second is on the worker's host: it serves until task 0 has ended the run."""
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    procs = []

    def spawn(cmd, **kw):
        p = subprocess.Popen(cmd, start_new_session=True, **kw)
        procs.append(p)
        return p

    def enter(pid):
        return ["nsenter", f"--target={pid}", "--user", "--net", "--preserve-credentials"]

    holder = "ip link set lo up && echo ready && exec cat"
    try:
        host_a = spawn(
            ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", holder],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert host_a.stdout.readline().strip() == b"ready"
        host_b = spawn(
            enter(host_a.pid) + ["unshare", "--net", "sh", "-c", holder],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert host_b.stdout.readline().strip() == b"ready"
        subprocess.run(
            enter(host_a.pid)
            + [
                "sh",
                "-c",
                f"ip link add va type veth peer name vb "
                f"&& ip link set vb netns {host_b.pid} && ip addr add 10.9.0.1/24 dev va "
                f"&& ip link set va up",
            ],
            check=True,
            timeout=30,
        )
        subprocess.run(
            enter(host_b.pid) + ["sh", "-c", "ip addr add 10.9.0.2/24 dev vb && ip link set vb up"],
            check=True,
            timeout=30,
        )
        (tmp_path / "cluster.json").write_text(
            json.dumps({"ps": ["10.9.0.1:2222", "10.9.0.2:2223"][:ps], "worker": ["10.9.0.2:2222"]})
        )
        cfg = protocol.validate(
            protocol.RunConfig(
                workers=1, mode="sync", steps=60, lr=0.5, run_id="veth", train_size=3000
            )
        )
        (tmp_path / "run.json").write_text(json.dumps(cfg.to_dict()))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        nodes = []
        roles = [(host_a, "ps", 0), (host_b, "worker", 0)] + [(host_b, "ps", 1)] * (ps == 2)
        for host, job, task in roles:
            log = open(tmp_path / f"{job}{task}.log", "wb")
            nodes.append(
                spawn(
                    enter(host.pid)
                    + [
                        sys.executable,
                        "-m",
                        "helpers.cluster.node",
                        "--cluster",
                        str(tmp_path / "cluster.json"),
                        "--job",
                        job,
                        "--task",
                        str(task),
                        "--run",
                        str(tmp_path / "run.json"),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                )
            )
            log.close()
        outputs = [n.communicate(timeout=150)[0] for n in nodes]
        tails = [log_tail(tmp_path / f"{j}{t}.log") for _, j, t in roles]
        assert [n.returncode for n in nodes] == [0] * len(roles), tails
        assert json.loads(outputs[0].splitlines()[-1])["test_accuracy"] > MIN_ACCURACY
        assert json.loads(outputs[1].splitlines()[-1])["steps"] >= 60
        from helpers.cluster.rundir import read_events

        ev = read_events(tmp_path)
        assert (ev.kind == "update").sum() == 60
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            for f in (p.stdin, p.stdout):
                if f:
                    f.close()
