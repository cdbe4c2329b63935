"""The grading progress line: pairs done, failures, and an ETA weighted by measured run times."""

from tools.course import progress
from tools.course.progress import GradingProgress, clock


def test_the_eta_weighs_pairs_by_their_lesson_and_scales_by_the_pace_so_far(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(
        progress,
        "run_times",
        lambda: {"slow": {"quick": {"seconds": 30.0}}, "fast": {"quick": {"seconds": 10.0}}},
    )
    bar = GradingProgress(
        [("ada", "slow"), ("ada", "fast"), ("bob", "slow"), ("bob", "new")],
        quick=True,
        enabled=False,
    )
    assert bar.eta_s() == 30 + 10 + 30 + progress.UNMEASURED_S  # no pace yet: the weights
    now[0] += 60.0  # the first pair took twice its measured time
    bar.done("ada", "slow", graded=True, failed=False)
    assert bar.eta_s() == 2 * (10 + 30 + progress.UNMEASURED_S)
    bar.done("ada", "fast", graded=False, failed=True)  # kept without running: costs no time
    assert bar.eta_s() == 2 * (30 + progress.UNMEASURED_S) and bar.failures == 1
    bar.close()


def test_clock_reads_as_minutes_or_hours():
    assert clock(59.6) == "1:00" and clock(3725) == "1:02:05"
