"""The pre-flight check: one row per check, a broken check shown as FAIL, needs from make run."""

import subprocess
import sys

from helpers import config, doctor


def test_every_check_gives_a_row_with_a_known_status():
    rows = doctor.run_checks()
    assert {r.status for r in rows} <= {doctor.OK, doctor.WARN, doctor.FAIL}
    names = [r.check for r in rows]
    for expected in (
        "python",
        "packages",
        "GPU",
        "cores",
        "disk",
        "datasets",
        "private network",
        "loopback ports",
        "cleanup",
    ):
        assert expected in names
    assert any(n.startswith("memory") for n in names)
    assert all(r.todo for r in rows if r.status != doctor.OK)  # every warning says what to do


def test_a_check_that_breaks_is_a_failed_row_and_the_command_exits_1(monkeypatch, capsys):
    def broken():
        raise OSError("no /proc here")

    monkeypatch.setattr(doctor, "CHECKS", [doctor.python_version, broken])
    rows = doctor.run_checks()
    assert (rows[1].check, rows[1].status, rows[1].found) == (
        "broken",
        "FAIL",
        "OSError: no /proc here",
    )
    assert doctor.main() == 1
    assert "FAILED: broken" in capsys.readouterr().out


def test_memory_rows_compare_free_memory_with_each_notebooks_measured_peak(monkeypatch):
    monkeypatch.setattr(
        doctor,
        "measured_needs",
        lambda: {
            "05_parameter_server": {"full": {"peak_pss_mb": 2600}, "quick": {"peak_pss_mb": 1900}},
            "02_logreg": {"full": {"peak_pss_mb": 800}},
        },
    )
    monkeypatch.setenv("LABS_MEMORY_MB", "1000")
    monkeypatch.delenv("LABS_QUICK", raising=False)
    rows = {r.check: r for r in doctor.memory()}
    assert rows["memory 05"].status == "warn"
    assert rows["memory 05"].found == "needs ~2,600 MB in full mode; 1,000 MB free (LABS_MEMORY_MB)"
    assert "quick mode (LABS_QUICK=1) needs ~1,900 MB" in rows["memory 05"].todo
    assert rows["memory 02"].status == "ok"


def test_every_notebook_has_a_measured_peak_in_both_modes():
    needs = doctor.measured_needs()
    missing = [
        (name, mode)
        for name in needs
        for mode in ("full", "quick")
        if "peak_pss_mb" not in needs[name].get(mode, {})
    ]
    assert not missing, (
        f"run `make run` and `tools/run_notebooks.py --quick --record-times`: {missing}"
    )


def test_make_doctor_prints_its_table_in_seconds():
    out = subprocess.run(
        [sys.executable, "-m", "helpers.doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=config.REPO_ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checks passed or warned" in out.stdout and "python" in out.stdout
