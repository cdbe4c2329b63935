"""Turn a cluster Run's event logs into the tables and curves notebooks 05 and 06 plot.

Everything here reads what the cluster's processes wrote (runs/<run-id>/*.jsonl and the
PS's checkpoints); nothing is simulated. The no-cluster baseline they are compared with is
helpers.training.baseline_sgd.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from helpers.cluster.events import Kind
from helpers.cluster.rundir import RunDir, time_zero


def steps(run) -> pd.DataFrame:
    """Worker steps with `elapsed` seconds since training started."""
    ev = run.events
    st = ev[ev.kind == Kind.STEP].copy()
    st["elapsed"] = st.t - time_zero(run.events)
    st["worker"] = st.worker.astype(int)
    return st.reset_index(drop=True)


def updates(run) -> pd.DataFrame:
    """PS updates with `elapsed` seconds and the mean training loss of recent worker steps."""
    ev = run.events
    up = ev[ev.kind == Kind.UPDATE].copy()
    up["elapsed"] = up.t - time_zero(run.events)
    return up.reset_index(drop=True)


def staleness_values(run) -> np.ndarray:
    """Staleness of every gradient applied by the PS (one value per gradient, not per update)."""
    up = updates(run)
    return np.array([s for row in up.staleness for s in row], dtype=int)


def progress(run, grid: int = 200) -> pd.DataFrame:
    """Steps completed by each worker on a common time grid (columns: workers)."""
    st = steps(run)
    t = np.linspace(0, st.elapsed.max(), grid)
    cols = {}
    for w, rows in st.groupby("worker"):
        done = np.sort(rows.elapsed.to_numpy())
        cols[f"worker {w}"] = np.searchsorted(done, t, side="right")
    return pd.DataFrame(cols, index=pd.Index(t, name="elapsed_s"))


def delay_between_workers(run, grid: int = 200) -> pd.Series:
    """Steps between the fastest and the slowest worker over time."""
    prog = progress(run, grid)
    return (prog.max(axis=1) - prog.min(axis=1)).rename("delay_steps")


def worker_times(run) -> pd.DataFrame:
    """Per worker, the seconds its step calls took, split as each step logs them.

    `wait_s`: in the modes that wait every step, until the token and the parameters that ride
    on it arrived (the token's wait and the pull); in async, the first step's wait for its
    token only. `compute_s`: the rest of the step call (the gradient and the push; in async
    the pull too). `delay_s`: injected straggler delay. Counted from time zero (every worker
    joined): a wait that began before it was partly set-up (a worker started for the first
    time keeps the others' first token waiting), and only its part after time zero counts.
    timeline.phase_seconds splits the same time into every phase, from the stamps.
    """
    st = steps(run)
    began = np.array([stamps[0] for stamps in st.stamps], dtype=float)
    before = np.clip(time_zero(run.events) - began, 0.0, None)
    st["wait_s"] = np.clip(st.wait_s.to_numpy(dtype=float) - before, 0.0, None)
    return st.groupby("worker")[["compute_s", "wait_s", "delay_s"]].sum()


def resource_table(run) -> pd.DataFrame:
    """Per process: mean CPU% (100 = one core), peak RSS, PSS and USS (MB), tensor bytes
    sent/received.

    RSS counts TensorFlow's shared libraries in every process that maps them; PSS splits
    each shared page between those processes, so the processes' PSS add up to what they
    use together; USS is what only this process uses (see helpers.system.resources).
    Bytes count tensor payload: a pull is every float32 parameter, a push every float32
    gradient plus a 32-byte header. gRPC framing and TF's own control traffic are not in it.
    """
    st = steps(run)
    rows = {}
    for name, res in run.resources.items():
        row = {
            k: res[k]
            for k in ("cpu_percent", "peak_rss_mb", "peak_pss_mb", "peak_uss_mb")
            if k in res
        }
        if str(name).startswith("worker:"):
            mine = st[st.worker == int(str(name).split(":")[1])]
            row["mb_sent"] = mine.bytes_pushed.sum() / 1e6
            row["mb_received"] = mine.bytes_pulled.sum() / 1e6
        else:  # the PS receives every push and sends every pull
            row["mb_sent"] = st.bytes_pulled.sum() / 1e6
            row["mb_received"] = st.bytes_pushed.sum() / 1e6
        rows[name] = row
    return pd.DataFrame(rows).T.astype(float)


def eval_curve(run) -> pd.DataFrame:
    """The evaluator process's test accuracy per checkpoint, against the checkpoint's time.

    `elapsed` is when the PS wrote the checkpoint (seconds since training started), `lag_s`
    how much later the evaluator got to it. Needs LocalCluster(evaluator=True).
    """
    ev = run.events
    if Kind.EVAL not in set(ev.kind):
        raise ValueError(
            f"run {run.config.run_id} has no evaluator events: start the cluster "
            "with LocalCluster(..., evaluator=True)"
        )
    ckpts = ev[ev.kind == Kind.CHECKPOINT][["t", "version"]]
    evals = ev[ev.kind == Kind.EVAL][["t", "version", "test_accuracy"]]
    curve = evals.merge(ckpts, on="version", suffixes=("_eval", "_ckpt"))
    curve["elapsed"] = curve.t_ckpt - time_zero(run.events)
    curve["lag_s"] = curve.t_eval - curve.t_ckpt
    curve["version"] = curve.version.astype(int)
    curve = curve[curve.elapsed >= 0].sort_values("version")
    return curve[["elapsed", "version", "test_accuracy", "lag_s"]].reset_index(drop=True)


def test_curve(run) -> pd.DataFrame:
    """Test accuracy and loss of every checkpoint the PS wrote, against elapsed seconds.

    Needs a run trained with checkpoint_every > 0. The checkpoints are evaluated here, in
    this process, on the run's own test set, after the run.
    """
    from helpers.data import arrays
    from helpers.training import models

    cfg = run.config
    ev = run.events
    ckpts = ev[ev.kind == Kind.CHECKPOINT]
    if not len(ckpts):
        raise ValueError(f"run {cfg.run_id} has no checkpoints: train with checkpoint_every > 0")
    _, _, x_te, y_te, _ = arrays.load_arrays(cfg.data, 1, cfg.test_size, cfg.seed)
    classes = int(y_te.max()) + 1
    model = models.build(cfg.model, x_te.shape[1:], classes, cfg.seed)
    start, rows, record = time_zero(run.events), [], RunDir(run.dir)
    for t, version, file in zip(ckpts.t, ckpts.version, ckpts.file):
        for var, value in zip(model.trainable_variables, record.load_checkpoint(file)):
            var.assign(value)
        logits = np.asarray(model(x_te, training=False), dtype=np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        rows.append(
            {
                "elapsed": t - start,
                "version": int(version),
                "test_accuracy": float((logits.argmax(1) == y_te).mean()),
                "test_loss": float(-logp[np.arange(len(y_te)), y_te].mean()),
            }
        )
    curve = pd.DataFrame(rows)
    return curve[curve.elapsed >= 0].reset_index(drop=True)


def _first_hit(curve: pd.DataFrame, target: float, column: str) -> float:
    hit = curve[curve.test_accuracy >= target]
    return float(hit[column].iloc[0]) if len(hit) else float("inf")


def time_to_accuracy(curve: pd.DataFrame, target: float) -> float:
    """First elapsed second at which the test accuracy reaches `target` (inf if never)."""
    return _first_hit(curve, target, "elapsed")


def updates_to_accuracy(curve: pd.DataFrame, target: float) -> float:
    """PS version (updates applied) at which the test accuracy first reaches `target` (inf if
    never): with time_to_accuracy, time to a target splits into updates x time per update."""
    return _first_hit(curve, target, "version")
