"""Benchmark a cluster's start-up and memory with its processes forked from a fork server
(helpers/system/forkserver.py, the default on Linux) against spawned one by one (LABS_FORK=0),
and against the floor: five bare `tf.distribute.Server` processes started together.

Alternates the three, ROUNDS times, in this one run, the forked one twice: a first cluster,
whose fork server imports TensorFlow, and the next one, forked from the same server (a kernel's
second cluster). Each cluster is 1 PS + 4 workers (notebook 05's largest), started, given one
short async run of logistic regression, measured (the sum of its processes' PSS: shared pages
split between the processes that map them, so the sum is what the cluster costs together, its
fork server included), and stopped. Prints the medians and their ratios, and writes
runs/bench/startup_bench.json.
Usage: python -m bench.startup_bench [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import psutil  # noqa: E402

from helpers import config, files  # noqa: E402
from helpers.cluster import LocalCluster  # noqa: E402
from helpers.system import forkserver  # noqa: E402
from helpers.system.processes import free_ports  # noqa: E402
from helpers.system.resources import read_memory  # noqa: E402

WORKERS = 4
# one bare TF server, as a cluster's process is at its least: import TF, start a server
BARE = (
    "import sys, tensorflow as tf; s = tf.distribute.Server(tf.train.ClusterSpec("
    "{'ps': [sys.argv[1]]}), 'ps', 0, start=True); print('up', flush=True); sys.stdin.read()"
)


def cluster_once(fork: bool) -> dict:
    """Start 1 PS + WORKERS workers, forked or spawned; one short run; their PSS; stop."""
    os.environ[forkserver.FORK_ENV] = "1" if fork else "0"
    with LocalCluster(workers=WORKERS, isolate="auto") as c:
        ready = c.startup_s
        c.train(mode="async", model="logreg", steps=100, progress=False, seed=0)
        pids = list(c.pids.values()) + ([c.nodes.server.pid] if c.nodes.server else [])
        pss = sum(read_memory(psutil.Process(pid), full=True).pss or 0 for pid in pids) / 2**20
    return {"ready_s": ready, "pss_mb": pss, "processes": len(pids)}


def bare_once() -> dict:
    """Five bare TF servers started together: the seconds until all five are up."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BARE, f"localhost:{port}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for port in free_ports(1 + WORKERS)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "up", "a bare server did not start"
        ready = time.perf_counter() - t0
        pss = sum(read_memory(psutil.Process(p.pid), full=True).pss or 0 for p in procs) / 2**20
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdin.close()
            p.stdout.close()
    return {"ready_s": ready, "pss_mb": pss, "processes": len(procs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if not forkserver.enabled():
        sys.exit("the fork server is off on this machine (not Linux, or LABS_FORK=0)")
    runs: dict[str, list[dict]] = {"forked": [], "forked again": [], "spawned": [], "bare": []}
    for i in range(args.rounds):
        forkserver.end_shared()  # a first cluster: its fork server imports TensorFlow first
        runs["forked"].append(cluster_once(fork=True))
        runs["forked again"].append(cluster_once(fork=True))  # the next: the same server
        runs["spawned"].append(cluster_once(fork=False))
        runs["bare"].append(bare_once())
        print(f"round {i + 1}: " + "; ".join(f"{k} {v[-1]}" for k, v in runs.items()), flush=True)
    med = {
        (name, key): statistics.median(r[key] for r in rs)
        for name, rs in runs.items()
        for key in ("ready_s", "pss_mb")
    }
    ratios = {
        "ready_forked_vs_spawned": med["forked", "ready_s"] / med["spawned", "ready_s"],
        "ready_forked_vs_bare_servers": med["forked", "ready_s"] / med["bare", "ready_s"],
        "ready_forked_again_vs_bare_servers": med["forked again", "ready_s"]
        / med["bare", "ready_s"],
        "pss_forked_vs_spawned": med["forked", "pss_mb"] / med["spawned", "pss_mb"],
    }
    print(f"\n1 PS + {WORKERS} workers, median of {args.rounds} alternating rounds:")
    print("| | ready (s) | PSS of all its processes (MB) |\n| --- | ---: | ---: |")
    for name in runs:
        print(f"| {name} | {med[name, 'ready_s']:.1f} | {med[name, 'pss_mb']:.0f} |")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    out = {
        "machine_cores": os.cpu_count(),
        "runs": runs,
        "medians": {f"{n}_{k}": v for (n, k), v in med.items()},
        "ratios": ratios,
    }
    path = files.write_json(config.runs_dir("bench") / "startup_bench.json", out, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
