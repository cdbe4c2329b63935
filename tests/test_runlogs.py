"""Tables and curves read from a run's event logs: checked on hand-written logs whose answers
are known, and the checkpoint evaluation against a NumPy/scikit-learn reference."""

import json

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, log_loss

from helpers.cluster import protocol, runlogs
from helpers.cluster.run import Run
from helpers.data import arrays
from helpers.training import baseline_sgd

T0 = 1000.0


def write_run(tmp_path, events, config=None, resources=None):
    """Write events as the cluster's processes do (one .jsonl per process) and wrap them in a
    Run."""
    files = {}
    for source, row in events:
        files.setdefault(source, []).append(json.dumps(row))
    for source, lines in files.items():
        (tmp_path / f"{source}.jsonl").write_text("\n".join(lines) + "\n")
    cfg = config or protocol.validate(protocol.RunConfig(workers=2, train_size=200, run_id="t"))
    return Run(cfg, tmp_path, {"ps:0": {"test_accuracy": 0.5}}, 1.0, resources or {}, [])


def step(worker, s, t, **kw):
    row = {
        "t": T0 + t,
        "kind": "step",
        "worker": worker,
        "step": s,
        "compute_s": 0.1,
        "wait_s": 0.2,
        "delay_s": 0.0,
        "bytes_pulled": 40,
        "bytes_pushed": 72,
        "loss": 1.0,
        "gap": None,
        # waiting, called, reached, granted, arrived, computed, pushed, returned
        "stamps": [T0 + t - 0.3] * 2 + [T0 + t - 0.25] * 3 + [T0 + t - 0.1] * 2 + [T0 + t],
    }
    row.update(kw)
    return (f"worker-{worker}", row)


def test_progress_and_delay_between_workers(tmp_path):
    events = [("ps-0", {"t": T0, "kind": "joined", "workers": [0, 1]})]
    events += [step(0, s, t) for s, t in enumerate([1, 2, 3, 4])]
    events += [step(1, s, t) for s, t in enumerate([2, 4])]
    run = write_run(tmp_path, events)
    prog = runlogs.progress(run, grid=5)  # t = 0, 1, 2, 3, 4
    assert prog["worker 0"].tolist() == [0, 1, 2, 3, 4]
    assert prog["worker 1"].tolist() == [0, 0, 1, 1, 2]
    assert runlogs.delay_between_workers(run, grid=5).tolist() == [0, 1, 1, 2, 2]
    times = runlogs.worker_times(run)
    assert times.loc[0, "wait_s"] == pytest.approx(0.8) and times.loc[
        1, "compute_s"
    ] == pytest.approx(0.2)


def test_worker_times_count_a_wait_from_time_zero(tmp_path):
    # worker 1 began waiting for its first token 2 s before every worker had joined: set-up
    early = step(1, 0, 0.5, wait_s=2.5)
    early[1]["stamps"][0] = T0 - 2.0
    events = [("ps-0", {"t": T0, "kind": "joined", "workers": [0, 1]}), early, step(0, 0, 1)]
    times = runlogs.worker_times(write_run(tmp_path, events))
    assert times.loc[1, "wait_s"] == pytest.approx(0.5) and times.loc[0, "wait_s"] == 0.2


def test_staleness_and_resource_table_count_every_gradient_and_byte(tmp_path):
    events = [
        ("ps-0", {"t": T0, "kind": "joined", "workers": [0, 1]}),
        ("ps-0", {"t": T0 + 1, "kind": "update", "version": 1, "staleness": [0, 2]}),
        ("ps-0", {"t": T0 + 2, "kind": "update", "version": 2, "staleness": [1]}),
        step(0, 0, 1),
        step(0, 1, 2, bytes_pulled=0),
        step(1, 0, 1, bytes_pushed=0),
    ]
    resources = {
        "ps:0": {
            "cpu_percent": 50.0,
            "peak_rss_mb": 700.0,
            "peak_pss_mb": 420.0,
            "peak_uss_mb": 300.0,
        },
        "worker:0": {"cpu_percent": 20.0, "peak_rss_mb": 600.0},
        "worker:1": {"cpu_percent": 10.0, "peak_rss_mb": 650.0},
    }
    run = write_run(tmp_path, events, resources=resources)
    assert sorted(runlogs.staleness_values(run)) == [0, 1, 2]
    table = runlogs.resource_table(run)
    assert table.loc["worker:0", "mb_sent"] == pytest.approx(2 * 72 / 1e6)
    assert table.loc["worker:0", "mb_received"] == pytest.approx(40 / 1e6)
    assert table.loc["worker:1", "mb_sent"] == 0
    # the PS receives what the workers push and sends what they pull
    assert table.loc["ps:0", "mb_received"] == pytest.approx(2 * 72 / 1e6)
    assert table.loc["ps:0", "mb_sent"] == pytest.approx(2 * 40 / 1e6)
    assert table.loc["ps:0", "peak_rss_mb"] == 700.0
    assert table.loc["ps:0", "peak_pss_mb"] == 420.0 and table.loc["ps:0", "peak_uss_mb"] == 300.0
    assert np.isnan(table.loc["worker:0", "peak_pss_mb"])  # not sampled for it


def test_time_to_accuracy_is_the_first_crossing():
    import pandas as pd

    curve = pd.DataFrame({"elapsed": [0.5, 1.0, 1.5, 2.0], "test_accuracy": [0.5, 0.8, 0.79, 0.9]})
    assert runlogs.time_to_accuracy(curve, 0.8) == 1.0
    assert runlogs.time_to_accuracy(curve, 0.95) == float("inf")


def test_updates_to_accuracy_is_the_same_crossing():
    import pandas as pd

    curve = pd.DataFrame(
        {
            "elapsed": [0.5, 1.0, 1.5, 2.0],
            "version": [5, 10, 15, 20],
            "test_accuracy": [0.5, 0.8, 0.79, 0.9],
        }
    )
    assert runlogs.updates_to_accuracy(curve, 0.8) == 10
    assert runlogs.updates_to_accuracy(curve, 0.85) == 20
    assert runlogs.updates_to_accuracy(curve, 0.95) == float("inf")


def test_test_curve_matches_numpy_and_sklearn(tmp_path, shared_data):
    cfg = protocol.validate(
        protocol.RunConfig(workers=1, train_size=200, test_size=500, run_id="t")
    )
    _, _, x_te, y_te, _ = arrays.load_arrays("mnist", 1, 500, 0)
    rng = np.random.default_rng(0)
    (tmp_path / "ckpt").mkdir()
    events = [("ps-0", {"t": T0, "kind": "joined", "workers": [0]})]
    expected = []
    for version in (5, 10):
        w0, w1 = (
            rng.normal(0, 0.05, (784, 10)).astype(np.float32),
            rng.normal(0, 0.1, 10).astype(np.float32),
        )
        np.savez(tmp_path / "ckpt" / f"ckpt-{version:07d}.npz", w0=w0, w1=w1)
        events.append(
            (
                "ps-0",
                {
                    "t": T0 + version,
                    "kind": "checkpoint",
                    "version": version,
                    "file": f"ckpt-{version:07d}.npz",
                },
            )
        )
        logits = x_te.reshape(len(x_te), -1).astype(np.float64) @ w0 + w1
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        expected.append(
            (accuracy_score(y_te, logits.argmax(1)), log_loss(y_te, p, labels=range(10)))
        )
    curve = runlogs.test_curve(write_run(tmp_path, events, config=cfg))
    assert curve.version.tolist() == [5, 10] and curve.elapsed.tolist() == [5.0, 10.0]
    for (acc, loss), (_, row) in zip(expected, curve.iterrows()):
        assert row.test_accuracy == pytest.approx(acc, abs=1e-9)
        assert row.test_loss == pytest.approx(loss, rel=1e-4)


def test_curves_without_checkpoints_or_evaluator_say_what_to_do(tmp_path):
    run = write_run(
        tmp_path, [("ps-0", {"t": T0, "kind": "joined", "workers": [0, 1]}), step(0, 0, 1)]
    )
    with pytest.raises(ValueError, match="checkpoint_every > 0"):
        runlogs.test_curve(run)
    with pytest.raises(ValueError, match="evaluator=True"):
        runlogs.eval_curve(run)


def test_one_process_baseline_learns(shared_data):
    result = baseline_sgd.one_process(steps=100, lr=0.5, train_size=3000, test_size=1000)
    assert len(result["losses"]) == 100 and np.all(np.diff(result["elapsed"]) >= 0)
    assert result["losses"][-20:].mean() < 0.5 * result["losses"][:5].mean()
    assert result["test_accuracy"] > 0.8
