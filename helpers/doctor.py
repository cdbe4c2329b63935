"""Pre-flight check: can this machine run the lessons? `make doctor`, or notebook 00's first table.

Each check gives one row: ok, warn (the lessons run, with a limit worth knowing) or FAIL (a
lesson will not run), what was found, and what to do. A check that itself breaks is a FAIL
that names the error: nothing fails silently. `python -m helpers.doctor` prints the table and
exits 1 when any row is FAIL.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import socket
import sys
from dataclasses import dataclass

from helpers import config

PACKAGES = [
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "gensim",
    "scikit-learn",
    "numpy",
    "pandas",
    "matplotlib",
    "ipywidgets",
    "psutil",
    "nbval",
]
TESTED_PYTHONS = ((3, 11), (3, 12), (3, 13))  # the versions CI builds an environment for
RUN_OUTPUTS_MB = 1024  # room for runs/: TensorBoard logs, checkpoints, features, event logs
OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Check:
    """One row of the table."""

    check: str
    status: str
    found: str
    todo: str = ""


def versions() -> dict[str, str]:
    """Installed versions of Python and of the packages the notebooks rely on."""
    import platform

    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def python_version() -> Check:
    v = sys.version_info[:2]
    found = f"Python {sys.version.split()[0]}"
    if v < TESTED_PYTHONS[0]:
        return Check(
            "python",
            FAIL,
            found,
            "install Python 3.11 or newer, then `make venv PYTHON=python3.11`",
        )
    if v not in TESTED_PYTHONS:
        return Check(
            "python",
            WARN,
            found,
            "untested: 3.11 to 3.13 are; if a package fails to install, use one of those",
        )
    return Check("python", OK, found)


def packages() -> Check:
    """Every pinned requirement of the project installed at a version its pin allows."""
    from packaging.requirements import Requirement

    try:
        wanted = [Requirement(r) for r in md.requires("scaling-ml-labs") or []]
    except md.PackageNotFoundError:
        return Check(
            "packages",
            FAIL,
            "the project is not installed in this Python",
            f"run `make venv` (or `{sys.executable} -m pip install -e .`)",
        )
    wanted = [r for r in wanted if not r.marker or r.marker.evaluate({"extra": ""})]
    wrong = []
    for req in wanted:
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            wrong.append(f"{req.name} missing")
            continue
        if not req.specifier.contains(have, prereleases=True):
            wrong.append(f"{req.name} {have} (pinned {req.specifier})")
    if wrong:
        return Check(
            "packages",
            FAIL,
            "; ".join(wrong),
            "run `make venv` again (it reinstalls "
            "when pyproject.toml changes), or `pip install -e .`",
        )
    return Check("packages", OK, f"all {len(wanted)} pinned packages at their pinned versions")


def tensorflow_devices() -> Check:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return Check("GPU", OK, ", ".join(g.name.replace("/physical_device:", "") for g in gpus))
    return Check(
        "GPU",
        OK,
        f"none visible to TensorFlow {tf.__version__}: every lesson runs on the CPU",
        "with an NVIDIA GPU on Linux, `make gpu`",
    )


def cores() -> Check:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    found = f"{usable} usable of {os.cpu_count()} CPU cores"
    if (usable or 1) < 2:
        return Check(
            "cores",
            WARN,
            found,
            "runs, slowly: the clusters' processes and notebook "
            "04's logical devices all share one core",
        )
    return Check("cores", OK, found)


def measured_needs() -> dict[str, dict]:
    """Per notebook, what `make run` measured (wall time, peak memory) in each mode."""
    return config.run_times()


def memory() -> list[Check]:
    """Free memory against each notebook's measured peak (PSS of the kernel and its
    processes), in the mode LABS_QUICK selects."""
    from helpers.system import resources

    free, source = resources.available_memory_mb()
    mode = "quick" if config.is_quick() else "full"
    rows = []
    for name, modes in measured_needs().items():
        peak = modes.get(mode, {}).get("peak_pss_mb")
        if peak is None or name.startswith("00"):
            continue
        found = f"needs ~{peak:,} MB in {mode} mode; {free:,} MB free ({source})"
        if peak > free:
            quick = modes.get("quick", {}).get("peak_pss_mb")
            hint = (
                f"; quick mode (LABS_QUICK=1) needs ~{quick:,} MB"
                if mode == "full" and quick
                else ""
            )
            rows.append(
                Check(
                    f"memory {name[:2]}", WARN, found, f"close other notebooks and programs{hint}"
                )
            )
        else:
            rows.append(Check(f"memory {name[:2]}", OK, found))
    if not rows:
        rows.append(
            Check(
                "memory",
                WARN,
                f"{free:,} MB free ({source}); no measured needs",
                "`make run` measures each notebook's peak memory",
            )
        )
    return rows


def disk() -> Check:
    """Free disk where the data cache and the run outputs go."""
    from helpers.data.downloads import DATASETS

    cache, runs = config.data_dir(), config.runs_dir(create=False)
    need = RUN_OUTPUTS_MB
    for ds in DATASETS.values():
        cached = (cache / ds.filename).exists() or (
            ds.extract_to and (cache / ds.extract_to).exists()
        )
        if not cached and not (ds.name == "dbpedia" and os.environ.get("LABS_DBPEDIA_DIR")):
            extracted = sum(size for _, size in ds.members.values())
            need += ((ds.size or extracted) + extracted) // 2**20  # the archive and its contents
    free = min(shutil.disk_usage(_existing(p)).free // 2**20 for p in (cache, runs))
    found = (
        f"{free:,} MB free; downloads and run outputs need about {need:,} MB (data cache "
        f"{cache}, run outputs {runs})"
    )
    if free < need:
        return Check(
            "disk",
            FAIL,
            found,
            "free space, or point LABS_DATA_DIR and LABS_RUNS_DIR at a larger disk",
        )
    return Check("disk", OK, found)


def _existing(path):
    while not path.exists():
        path = path.parent
    return path


def datasets() -> Check:
    from helpers.data.downloads import available

    where = available()
    found = "; ".join(f"{k}: {v}" for k, v in where.items())
    if any("nowhere" in v for v in where.values()):
        return Check(
            "datasets",
            FAIL,
            found,
            "see data/README.md: put the files in data/ or set LABS_DATA_MIRROR",
        )
    return Check("datasets", OK, found)


def network_namespace() -> Check:
    from helpers.system import netns

    reason = netns.unavailable_reason()
    if reason:
        return Check(
            "private network",
            WARN,
            reason,
            "clusters run, but their servers listen "
            "on every network interface while they run: use a trusted network (or a "
            "firewall); on Linux, allow unprivileged user namespaces",
        )
    return Check("private network", OK, "clusters run in a namespace of their own, loopback only")


def loopback_ports() -> Check:
    """A server can bind a port and a client reach it, as every cluster needs."""
    from helpers.system.processes import free_ports

    port = free_ports(1)[0]
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", port))
        server.listen(1)
        client.settimeout(5)
        client.connect(("127.0.0.1", port))
    return Check("loopback ports", OK, f"port {port} bound and reached on 127.0.0.1")


def parent_death() -> Check:
    """How the processes a lesson starts end when its kernel dies."""
    from helpers.system import processes

    prctl = sys.platform.startswith("linux") and config.env_flag(processes.PDEATHSIG_ENV, True)
    how = "a lifeline pipe" + (" and Linux's parent-death signal" if prctl else "")
    return Check("cleanup", OK, f"child processes end with their kernel through {how}")


def mode() -> Check:
    if config.is_quick():
        return Check("mode", OK, "quick (LABS_QUICK=1): small runs, as in CI")
    return Check("mode", OK, "full lessons", "LABS_QUICK=1 runs every lesson small, in minutes")


CHECKS = [
    mode,
    python_version,
    packages,
    tensorflow_devices,
    cores,
    memory,
    disk,
    datasets,
    network_namespace,
    loopback_ports,
    parent_death,
]


def run_checks() -> list[Check]:
    """Every check; one that raises becomes a FAIL row naming the error."""
    rows = []
    for check in CHECKS:
        try:
            out = check()
        except Exception as exc:  # the table must show it, not stop
            out = Check(
                check.__name__.replace("_", " "),
                FAIL,
                f"{type(exc).__name__}: {exc}",
                "report this output with your platform",
            )
        rows.extend(out if isinstance(out, list) else [out])
    return rows


def table(rows: list[Check] | None = None):
    """The checks as a DataFrame (for notebook 00)."""
    import pandas as pd

    rows = run_checks() if rows is None else rows
    return pd.DataFrame([vars(r) for r in rows]).set_index("check")


def main() -> int:
    rows = run_checks()
    width = max(len(r.check) for r in rows)
    for r in rows:
        print(f"{r.check:<{width}}  {r.status:<4}  {r.found}")
        if r.todo:
            print(f"{'':<{width}}        -> {r.todo}")
    failed = [r.check for r in rows if r.status == FAIL]
    print(
        f"\n{len(rows) - len(failed)} of {len(rows)} checks passed or warned"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
