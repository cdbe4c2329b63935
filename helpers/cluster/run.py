"""The record of one training run on a LocalCluster: its config, events and summary."""

from __future__ import annotations

from pathlib import Path

from helpers.cluster.events import Kind
from helpers.cluster.rundir import RunDir, last_attempt_window, ps_tasks


class Run:
    """The record of one training run: its config, event log and resource figures."""

    def __init__(self, cfg, run_dir, results, wall_s, resources, dead_workers):
        self.config, self.dir, self.results = cfg, Path(run_dir), results
        self.wall_s, self.resources, self.dead_workers = wall_s, resources, dead_workers
        self.loopback_bytes = None  # all traffic of the run, when the cluster is isolated
        self.cpu_samples: dict = {}  # process name -> [(wall time, CPU seconds so far)]
        self._events = None

    @property
    def events(self):
        """pandas DataFrame: one row per worker step and per PS update (and other events)."""
        if self._events is None:
            self._events = RunDir(self.dir).events()
        return self._events

    @property
    def test_accuracy(self) -> float:
        """Test accuracy of the final parameters, computed by the PS."""
        return float(self.results["ps:0"]["test_accuracy"])

    def training_window(self) -> tuple[float, float]:
        """Wall-clock start and end of this run's training: from the workers' joining (after
        the warm-up, which traces the step functions) to the last update."""
        return last_attempt_window(self.events)

    def in_training(self, kind: str):
        """This run's events of `kind` within its training window (a DataFrame), and the
        window's seconds."""
        start, end = self.training_window()
        ev = self.events
        return ev[(ev.kind == kind) & (ev.t > start) & (ev.t <= end)], end - start

    @property
    def ps_tasks(self) -> int:
        """How many PS tasks held the parameters."""
        return ps_tasks(self.events)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each process used while the run trained (`training_window`)."""
        from helpers.system.resources import cpu_seconds_between

        start, end = self.training_window()
        return {
            name: cpu_seconds_between(samples, start, end)
            for name, samples in self.cpu_samples.items()
        }

    def timeline(
        self,
        start: float | str = 0.0,
        seconds: float | None = None,
        ax=None,
        title: str | None = None,
    ):
        """Draw what every worker did when (wait, pull, compute, push, delay) and the PS's
        updates, drops and checkpoints; `start`/`seconds` pick a window (see timeline.plot)."""
        from helpers.cluster import timeline

        return timeline.plot(
            self.events,
            start,
            seconds,
            ax,
            title or f"{self.config.mode}, {self.config.workers} workers",
        )

    def to_chrome_trace(self, path) -> Path:
        """Write the timeline as Trace Event JSON for Perfetto or chrome://tracing."""
        from helpers.cluster import timeline

        return timeline.to_chrome_trace(self.events, path, name=self.config.run_id)

    def summary(self) -> dict:
        """Steps/s, staleness, test accuracy, bytes, CPU% and peak RSS per process."""
        ev = self.events
        steps = ev[ev.kind == Kind.STEP]
        updates = ev[ev.kind == Kind.UPDATE]
        span = (steps.t.max() - steps.t.min()) if len(steps) > 1 else float("nan")
        stale = [s for row in updates.staleness for s in row] if len(updates) else []
        return {
            "mode": self.config.mode,
            "workers": self.config.workers,
            "wall_s": round(self.wall_s, 2),
            "worker_steps": int(len(steps)),
            "ps_updates": int(len(updates)),
            "steps_per_s": len(steps) / span if span else float("nan"),
            "updates_per_s": len(updates) / span if span else float("nan"),
            "staleness_mean": float(sum(stale) / len(stale)) if stale else float("nan"),
            "staleness_max": int(max(stale)) if stale else 0,
            "dropped": int((ev.kind == Kind.DROP).sum()),
            "test_accuracy": self.test_accuracy,
            "bytes_pushed": int(steps.bytes_pushed.sum()),
            "bytes_pulled": int(steps.bytes_pulled.sum()),
            "loopback_bytes": self.loopback_bytes,
            "dead_workers": self.dead_workers,
            "resources": self.resources,
        }
