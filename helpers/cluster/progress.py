"""Live progress bars of a cluster run: PS updates, and steps of each worker."""
from __future__ import annotations

from helpers.cluster.events import Kind


class RunProgress:
    """tqdm bars fed with the run's new events (see events.EventTail)."""

    def __init__(self, cfg):
        from tqdm.auto import tqdm

        self.bars = {"ps-0": tqdm(total=cfg.steps, desc="PS updates", leave=False)}
        for w in cfg.worker_ids:
            self.bars[f"worker-{w}"] = tqdm(desc=f"worker {w} steps", leave=False)

    def update(self, events: list[dict]) -> None:
        """Count each PS update and each worker step among these events."""
        counts: dict[str, int] = {}
        for e in events:
            if (e["source"], e["kind"]) == ("ps-0", Kind.UPDATE) or e["kind"] == Kind.STEP:
                counts[e["source"]] = counts.get(e["source"], 0) + 1
        for source, n in counts.items():
            if source in self.bars:
                self.bars[source].update(n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
