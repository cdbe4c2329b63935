"""The live dashboard of a cluster run: RunState (runstate.py) drawn as it happens.

In a Jupyter kernel, an ipywidgets HTML widget redrawn a few times a second: a table of the
workers and the PS, and a small SVG plot of each worker's clock against time, with the SSP
bound. At the end the widget is closed and a static copy of its last frame is displayed in its
place, which the executed notebook keeps and any browser shows offline (no scripts). Elsewhere
(a script, a terminal) a plain-text line every few seconds. Our own code: tqdm draws one number
per bar, and TensorBoard shows a run's scalars after they are written, not what a cluster's
processes are doing now.
"""

from __future__ import annotations

import html
import os
import sys
import time

from helpers.cluster.runstate import RunState

REDRAW_S = 0.25  # the widget's redraw interval (4 frames a second at most)
TEXT_EVERY_S = 5.0  # the text fallback's line interval
COLOURS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]  # matplotlib's tab10, so plots and dashboard agree
PHASE_COLOURS = {
    "wait": "#d9d9d9",
    "pull": "#9ecae1",
    "compute": "#3182bd",
    "push": "#fd8d3c",
    "delay": "#fdd0a2",
}


def render_html(state: RunState, now: float | None = None) -> str:
    """The frame as HTML that needs nothing else (a table and an inline SVG plot; no scripts)."""
    f = state.frame(now)
    ps_stats = f["ps"]
    head = (
        f"<b>{html.escape(f['mode'])}</b>"
        + (f" (bound s={f['bound']})" if f["bound"] is not None else "")
        + f" &middot; {ps_stats['elapsed_s']:.1f} s &middot; PS version "
        f"{_fmt(ps_stats['version'])}, {ps_stats['updates']}/{ps_stats['of']} updates, "
        f"{ps_stats['updates/s']:.0f}/s"
        + (
            ""
            if ps_stats["pending pushes"] is None
            else f", pushes held: {ps_stats['pending pushes']}"
        )
        + f", {ps_stats['drops']} dropped"
        + ("" if ps_stats["folds"] is None else f", {ps_stats['folds']} folded")
        + (" &middot; <b>finished</b>" if f["finished"] else "")
        + (" &middot; workers warming up" if f["warming up"] else "")
        + (
            " &middot; <span style='color:#c00'>PS process stopped</span>"
            if f["ps stopped"]
            else ""
        )
    )
    rows = []
    for r in f["workers"]:
        colour = COLOURS[r["worker"] % len(COLOURS)]
        doing = r["doing"]
        style = {
            "waiting for a token": "color:#b36b00",
            "dead": "color:#c00",
            "stopped": "color:#c00",
            "silent (hung?)": "color:#c00",
        }.get(doing, "")
        cells = [
            f"<span style='color:{colour}'>&#9632;</span> worker {r['worker']}",
            r["clock"],
            _fmt(r["version read"]),
            _fmt(r["staleness"]),
            f"<span style='{style}'>{doing}</span>",
            f"{r['steps/s']:.1f}",
            _phase_bar(r["last step"]),
        ]
        rows.append(
            "<tr>"
            + "".join(f"<td style='padding:1px 10px 1px 0'>{c}</td>" for c in cells)
            + "</tr>"
        )
    cells = "".join(
        f"<th style='text-align:left;padding:0 10px 0 0'>{h}</th>"
        for h in ("", "clock", "version read", "staleness", "doing", "steps/s", "last step")
    )
    legend = " ".join(
        f"<span style='background:{c};padding:0 4px'>{p}</span>" for p, c in PHASE_COLOURS.items()
    )
    frame_kind = "final" if f["finished"] else "live"
    return (
        f"<div class='labs-dashboard labs-dashboard-{frame_kind}' "
        "style='font-family:sans-serif;font-size:12px'>"
        f"<div>{head}</div><div style='display:flex;flex-wrap:wrap;gap:16px;"
        "align-items:flex-start'>"
        f"<table class='labs-workers' style='border-collapse:collapse;white-space:nowrap'>"
        f"<tr>{cells}</tr>{''.join(rows)}</table>{_svg(state)}</div>"
        f"<div style='font-size:11px;color:#555'>last step: {legend}</div></div>"
    )


def _svg(state: RunState, width=340, height=170, pad=30) -> str:
    """Each worker's clock against time since the run began; SSP: slowest clock + s."""
    t0 = state.joined or state.started
    series = {
        w: [(t, c) for t, c in s.points if t0 is None or t >= t0] for w, s in state.workers.items()
    }
    series = {w: p for w, p in series.items() if p}
    if not series:
        return f"<svg width='{width}' height='{height}'></svg>"
    t0 = t0 or min(p[0][0] for p in series.values())
    bound = [(t, c) for t, c in state.bound_points if t >= t0]
    t1 = max(p[-1][0] for p in series.values())
    top = max(max(c for _, c in p) for p in series.values())
    if bound:
        top = max(top, max(c for _, c in bound))
    sx = (width - pad - 6) / max(t1 - t0, 1e-6)
    sy = (height - pad - 6) / max(top, 1)

    def xy(t, c):
        return f"{pad + (t - t0) * sx:.1f},{height - pad - c * sy:.1f}"

    lines = []
    if bound:
        pts = " ".join(xy(t, c) for t, c in bound)
        lines.append(
            f"<polyline points='{pts}' fill='none' stroke='#999' "
            "stroke-dasharray='4 3'><title>SSP bound</title></polyline>"
        )
    for w, points in series.items():
        colour = COLOURS[w % len(COLOURS)]
        pts = " ".join(xy(t, c) for t, c in points)
        lines.append(
            f"<polyline points='{pts}' fill='none' stroke='{colour}' "
            f"stroke-width='1.5'><title>worker {w}</title></polyline>"
        )
        if state.workers[w].dead:
            x, y = xy(*points[-1]).split(",")
            lines.append(
                f"<text x='{x}' y='{y}' fill='#c00' font-size='14' "
                "text-anchor='middle'>&#10005;</text>"
            )
    axes = (
        f"<line x1='{pad}' y1='{height - pad}' x2='{width - 4}' y2='{height - pad}' "
        "stroke='#444'/>"
        f"<line x1='{pad}' y1='4' x2='{pad}' y2='{height - pad}' stroke='#444'/>"
        f"<text x='{width - 4}' y='{height - pad + 12}' text-anchor='end' "
        f"font-size='10'>{t1 - t0:.1f} s</text>"
        f"<text x='{pad}' y='{height - pad + 12}' text-anchor='middle' "
        "font-size='10'>0</text>"
        f"<text x='{pad - 3}' y='12' text-anchor='end' font-size='10'>{top}</text>"
        f"<text x='{pad}' y='{height - 4}' font-size='10'>clock (steps done) "
        "against time" + (", dashed: slowest + s" if bound else "") + "</text>"
    )
    return (
        f"<svg class='labs-clocks' width='{width}' height='{height}' "
        f"xmlns='http://www.w3.org/2000/svg'>{axes}{''.join(lines)}</svg>"
    )


def render_text(state: RunState, now: float | None = None) -> str:
    """The frame as one line of plain text."""
    f = state.frame(now)
    ps_stats = f["ps"]
    workers = "; ".join(f"w{r['worker']} {r['clock']} {r['doing']}" for r in f["workers"])
    return (
        f"[{f['mode']} {ps_stats['elapsed_s']:.1f} s] PS"
        + (" (stopped)" if f["ps stopped"] else "")
        + f" v{_fmt(ps_stats['version'])} "
        f"({ps_stats['updates']}/{ps_stats['of']}, {ps_stats['updates/s']:.0f}/s, "
        f"{ps_stats['drops']} dropped) "
        f"| {workers}"
    )


def _fmt(value) -> str:
    return "-" if value is None else str(value)


def _phase_bar(phases: dict, width=120, height=10) -> str:
    """The last step's phases as one stacked bar, with its length in ms."""
    total = sum(phases.values())
    if total <= 0:
        return ""
    x, parts = 0.0, []
    for name, colour in PHASE_COLOURS.items():
        share = phases.get(name, 0.0) / total * width
        if share > 0:
            parts.append(
                f"<rect x='{x:.1f}' width='{share:.1f}' height='{height}' "
                f"fill='{colour}'><title>{name} {1000 * phases[name]:.1f} ms</title>"
                "</rect>"
            )
            x += share
    return f"<svg width='{width}' height='{height}'>{''.join(parts)}</svg> {1000 * total:.0f} ms"


def _in_kernel() -> bool:
    """True inside a Jupyter kernel with ipywidgets installed."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class Dashboard:
    """Shows a RunState live: a widget in Jupyter, a text line elsewhere (module docstring).

    Args:
        cfg: the run's RunConfig.
        style: "auto" (a widget in a Jupyter kernel, else text), "widget", "text", or the
            LABS_DASHBOARD environment variable's value when it is set.
        status: called at each redraw to ask which processes are stopped or dead (the
            launcher checks their PIDs): returns (stopped workers, dead workers, PS stopped).
    """

    def __init__(self, cfg, style: str = "auto", status=None):
        style = os.environ.get("LABS_DASHBOARD", style)
        if style not in ("auto", "widget", "text"):
            raise ValueError(
                f"dashboard style must be 'auto', 'widget' or 'text', got "
                f"{style!r} (from LABS_DASHBOARD when it is set)"
            )
        if style == "auto":
            style = "widget" if _in_kernel() else "text"
        self.state, self.style, self.status = RunState(cfg), style, status
        self.last_draw = 0.0
        self.widget = None
        if style == "widget":
            import ipywidgets
            from IPython.display import display

            self.widget = ipywidgets.HTML(value=render_html(self.state, time.time()))
            display(self.widget)

    def update(self, events: list[dict]) -> None:
        """Take new events; redraw when the last frame is old enough."""
        self.state.feed(events)
        now = time.time()
        every = REDRAW_S if self.widget is not None else TEXT_EVERY_S
        if now - self.last_draw >= every:
            self.draw(now)

    def _ask_status(self) -> None:
        if self.status is not None:
            stopped, dead, self.state.ps_stopped = self.status()
            self.state.stopped = set(stopped)
            for w in dead:
                if w in self.state.workers:
                    self.state.workers[w].dead = True

    def draw(self, now: float) -> None:
        self._ask_status()
        self.last_draw = now
        if self.widget is not None:
            self.widget.value = render_html(self.state, now)
        elif self.state.started is not None and self.state.final is None:  # close() ends it
            print(render_text(self.state, now), flush=True)

    def close(self, events: list[dict] = ()) -> None:
        """Take the last events; leave the final frame as static output (or a last line)."""
        self.state.feed(list(events))
        self._ask_status()
        if self.widget is not None:
            from IPython.display import HTML, display

            self.widget.close()
            display(HTML(render_html(self.state)))
        else:
            print(render_text(self.state), flush=True)
