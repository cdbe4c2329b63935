"""What a grading run shows while it goes: pairs done of all, the pair being graded, the
failures so far, and an ETA.

The ETA weighs each (student, notebook) pair by its lesson's measured run time
(notebooks/run_times.json, in the mode being graded) and scales those weights by how fast this
run has gone so far: a class's 06 notebooks cost more than its 02 notebooks, and a loaded
machine is slower than the one that measured.
"""

from __future__ import annotations

import threading
import time

from tqdm.auto import tqdm

from helpers.config import run_times

UNMEASURED_S = 60.0  # a lesson with no measurement yet counts as this many seconds


def clock(seconds: float) -> str:
    """Seconds as h:mm:ss (or m:ss)."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class GradingProgress:
    """A tqdm line over the pairs of one grading run (disabled: records only, prints nothing)."""

    def __init__(self, pairs: list[tuple[str, str]], quick: bool, enabled: bool = True):
        mode = "quick" if quick else "full"
        times = run_times()
        self.weight = {
            a: float(times.get(a, {}).get(mode, {}).get("seconds", UNMEASURED_S)) for _, a in pairs
        }
        self.left = sum(self.weight[a] for _, a in pairs)  # weights of the pairs not yet done
        self.done_weight, self.failures, self.t0 = 0.0, 0, time.monotonic()
        self.running: list[tuple[str, str]] = []  # pairs being graded now
        self.lock = threading.Lock()
        self.bar = tqdm(
            total=len(pairs),
            unit="pair",
            disable=not enabled,
            desc="grading",
            bar_format="{desc} {n_fmt}/{total_fmt} pairs [{elapsed}] {postfix}",
        )

    def eta_s(self) -> float:
        """Seconds still to go: the weights left, times the seconds per unit of weight so far."""
        elapsed = time.monotonic() - self.t0
        pace = elapsed / self.done_weight if self.done_weight > 0 else 1.0
        return self.left * pace

    def _show(self) -> None:
        now = ", ".join(f"{s}/{a}" for s, a in self.running)
        self.bar.set_postfix_str(
            f"now {now or '-'}; {self.failures} failed, ETA {clock(self.eta_s())}"
        )

    def start(self, student: str, notebook: str) -> None:
        """Show a pair that is now being graded (several may be at once); thread-safe."""
        with self.lock:
            self.running.append((student, notebook))
            self._show()

    def done(self, student: str, notebook: str, graded: bool, failed: bool) -> None:
        """Count one pair: `graded` if it ran (a kept or unchanged grade costs no time)."""
        with self.lock:
            if (student, notebook) in self.running:
                self.running.remove((student, notebook))
            self.left -= self.weight[notebook]
            self.done_weight += self.weight[notebook] if graded else 0.0
            self.failures += int(failed)
            self.bar.update(1)
            self._show()

    def close(self) -> None:
        self.bar.set_postfix_str(f"{self.failures} failed")
        self.bar.close()
