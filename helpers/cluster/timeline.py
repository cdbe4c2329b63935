"""A run's timeline from its event logs: what every worker did when, and what the PS decided.

`spans(events)` cuts each worker step into its phases (wait for the token, pull, compute,
push, and a simulated straggler's delay) from the step's wall-clock stamps (events.StepStamps);
`marks(events)` lists the PS's updates, drops, checkpoints and the faults and deaths. `plot`
draws both, one row per worker and one for the PS; `to_chrome_trace` writes them in the Trace
Event format that Perfetto (ui.perfetto.dev) and chrome://tracing open.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from helpers.cluster.dashboard import COLOURS, PHASE_COLOURS
from helpers.cluster.events import Kind, StepStamps
from helpers.cluster.rundir import first_start, time_zero
from helpers.files import atomic_path

PHASES = tuple(PHASE_COLOURS)  # wait, pull, compute, push, delay
MARKS = {
    Kind.UPDATE: ("update", "|", "#333"),
    Kind.DROP: ("drop", "x", "#d62728"),
    Kind.CHECKPOINT: ("checkpoint", "s", "#2ca02c"),
    Kind.FAULT: ("fault", "*", "#d62728"),
    Kind.DEAD: ("dead", "X", "#d62728"),
    Kind.TIMEOUT: ("timeout", "X", "#d62728"),
}


def spans(events: pd.DataFrame) -> pd.DataFrame:
    """One row per phase of every worker step: worker, step, phase, start, end (wall s)."""
    rows = []
    steps = events[events.kind == Kind.STEP] if len(events) else events
    if len(steps) and "stamps" not in steps:
        raise ValueError(
            "these events have no step stamps (written by an older version of "
            "the cluster): run the training again to draw its timeline"
        )
    for e in steps.itertuples(index=False):
        stamps = StepStamps(*e.stamps)
        for phase, a, b in stamps.phases():
            rows.append((int(e.worker), int(e.step), phase, a, b))
        if getattr(e, "delay_s", 0):
            rows.append(
                (int(e.worker), int(e.step), "delay", stamps.returned, stamps.returned + e.delay_s)
            )
    return pd.DataFrame(rows, columns=["worker", "step", "phase", "start", "end"])


def marks(events: pd.DataFrame) -> pd.DataFrame:
    """The PS's decisions and the faults: kind, t, version, worker (when one is named).

    In async a worker applies its gradient on the PS inside its own push, and the PS logs the
    updates afterwards, in ticket order and in batches: an async update is marked when the
    push that applied it ended (its step's `pushed` stamp), not when the PS logged it.
    """
    keep = events[events.kind.isin(list(MARKS))] if len(events) else events
    start = events[events.kind == Kind.START] if len(events) else events
    if len(start) and start["mode"].iloc[-1] == "async" and len(keep):
        steps = events[events.kind == Kind.STEP]
        pushed = {
            (int(e.worker), int(e.step)): StepStamps(*e.stamps).pushed
            for e in steps.itertuples(index=False)
            if e.pushed
        }
        keep = keep.copy()
        for i in keep.index[keep.kind == Kind.UPDATE]:
            key = (int(keep.at[i, "workers"][0]), int(keep.at[i, "steps"][0]))
            keep.at[i, "t"] = pushed.get(key, keep.at[i, "t"])
    worker = keep.get("worker", pd.Series(float("nan"), index=keep.index))
    # a worker's own fault record names it by its log file, "worker-N"
    own = keep.source.str.startswith("worker-")
    worker = worker.astype(float).copy()
    worker[own] = keep.source[own].str.removeprefix("worker-").astype(float)
    out = pd.DataFrame(
        {
            "kind": keep.kind.astype(str),
            "t": keep.t,
            "version": keep.get("version"),
            "worker": worker,
            "source": keep.source,
        }
    )
    return out.reset_index(drop=True)


def plot(
    events: pd.DataFrame,
    start: float | str = 0.0,
    seconds: float | None = None,
    ax=None,
    title: str | None = None,
):
    """Draw the timeline: a row per worker (phase bars) and one for the PS (its marks).

    Args:
        events: a run's events (Run.events).
        start, seconds: the window to draw, in seconds since every worker had joined (the
            run's time zero; set-up and warm-up come before it), default: all of it;
            start="middle" centres a window of `seconds` on the middle of the run.
        ax: a matplotlib Axes to draw on (default: a new figure).
    Returns the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t0 = time_zero(events)
    sp, mk = spans(events), marks(events)
    end = (
        max(sp.end.max() if len(sp) else events.t.max(), mk.t.max() if len(mk) else -float("inf"))
        - t0
    )
    if start == "middle":
        start = max(0.0, (end - (seconds or end)) / 2)
    elif isinstance(start, str):
        raise ValueError(f"start must be a number of seconds or 'middle', got {start!r}")
    lo, hi = start, end if seconds is None else min(start + seconds, end)
    workers = sorted(sp.worker.unique()) if len(sp) else []
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 * (len(workers) + 1) + 1.2))
    for row, w in enumerate(workers):
        mine = sp[(sp.worker == w) & (sp.end - t0 >= lo) & (sp.start - t0 <= hi)]
        for phase in PHASES:
            part = mine[mine.phase == phase]
            if len(part):
                ax.broken_barh(
                    list(zip(part.start - t0, part.end - part.start)),
                    (row - 0.4, 0.8),
                    facecolors=PHASE_COLOURS[phase],
                )
    ps_row = len(workers)
    shown = mk[(mk.t - t0 >= lo) & (mk.t - t0 <= hi)]
    for kind, (_label, marker, colour) in MARKS.items():
        part = shown[shown.kind == str(kind)]
        if not len(part):
            continue
        if kind == Kind.UPDATE:
            ax.vlines(part.t - t0, ps_row - 0.4, ps_row + 0.4, colors=colour, linewidth=0.6)
            continue
        rows = [
            ps_row
            if pd.isna(w) or kind not in (Kind.DROP, Kind.DEAD, Kind.FAULT)
            else workers.index(int(w))
            if int(w) in workers
            else ps_row
            for w in part.worker
        ]
        ax.scatter(part.t - t0, rows, marker=marker, color=colour, zorder=3, s=30)
    ax.set_yticks(range(len(workers) + 1), [f"worker {w}" for w in workers] + ["PS"])
    for tick, w in zip(ax.get_yticklabels(), workers):
        tick.set_color(COLOURS[int(w) % len(COLOURS)])
    ax.set_ylim(-0.6, ps_row + 0.6)
    ax.invert_yaxis()
    ax.set_xlim(lo, hi)
    ax.set_xlabel("seconds since every worker joined")
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLOURS.items() if p in set(sp.phase)]
    handles += [
        Line2D([], [], color=colour, marker=marker, linestyle="", label=label)
        for kind, (label, marker, colour) in MARKS.items()
        if str(kind) in set(shown.kind)
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def phase_seconds(events: pd.DataFrame) -> pd.DataFrame:
    """Seconds each worker spent in each phase (rows: workers; columns: phases).

    Counted from time zero (every worker joined): an async worker's wait for its first token
    while the others still set up is set-up, not training.
    """
    sp = spans(events)
    start = sp.start.clip(lower=time_zero(events))
    seconds = (sp.end - start).clip(lower=0.0).groupby([sp.worker, sp.phase]).sum()
    seconds = seconds.unstack(fill_value=0.0)
    return seconds.reindex(columns=[p for p in PHASES if p in seconds.columns])


def phase_shares(events: pd.DataFrame) -> pd.DataFrame:
    """The share of each phase in each worker's time, as counted by phase_seconds."""
    seconds = phase_seconds(events)
    return seconds.div(seconds.sum(axis=1), axis=0)


def to_chrome_trace(events: pd.DataFrame, path: Path | str, name: str = "run") -> Path:
    """Write the run as Trace Event JSON (Perfetto, chrome://tracing); returns the path.

    Process 1 is the run; thread 0 is the PS (instant events for its decisions), thread
    w + 1 is worker w (a complete event per phase of each step, named by the phase).
    Times are microseconds since the PS started the run (before the workers' set-up, so that
    every event has a time >= 0; the plot's time zero, when all had joined, comes later).
    """
    t0 = first_start(events)
    trace = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": name}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "PS"}},
    ]
    sp = spans(events)
    for w in sorted(sp.worker.unique()):
        trace.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 1,
                "tid": int(w) + 1,
                "args": {"name": f"worker {w}"},
            }
        )
    for e in sp.itertuples(index=False):
        trace.append(
            {
                "ph": "X",
                "name": e.phase,
                "cat": "step",
                "pid": 1,
                "tid": int(e.worker) + 1,
                "ts": round((e.start - t0) * 1e6, 1),
                "dur": round((e.end - e.start) * 1e6, 1),
                "args": {"step": int(e.step)},
            }
        )
    for m in marks(events).itertuples(index=False):
        args = {
            k: (None if pd.isna(v) else int(v))
            for k, v in (("version", m.version), ("worker", m.worker))
        }
        trace.append(
            {
                "ph": "i",
                "s": "t",
                "name": m.kind,
                "cat": "ps",
                "pid": 1,
                "tid": 0,
                "ts": round((m.t - t0) * 1e6, 1),
                "args": args,
            }
        )
    with atomic_path(Path(path)) as tmp:
        tmp.write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))
    return Path(path)
