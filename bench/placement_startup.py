"""Start-up of a cluster placed on other hosts against the same cluster on this machine.

    python -m bench.placement_startup --hosts lab1,lab2,lab3 [--ssh-config F] [--workers 4]
    python -m bench.placement_startup --slurm [--slurm-job ID]   # inside an allocation
    python -m bench.placement_startup --namespaced 3 [--slurm]   # root: the tests' hosts

Starts `LocalCluster(workers=N)` (1 PS) here and placed (over SSH, or through Slurm),
alternating, `--repeats` times each, and prints each start-up, the medians and their ratio
(placed / here), measured in one run. `--namespaced` makes network-namespace hosts with an
sshd each, and with --slurm a Slurm over them (tests/hosts.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import warnings
from pathlib import Path

from helpers.cluster import LocalCluster
from helpers.cluster.placement import SSH, Slurm


def startup(**kw) -> float:
    with LocalCluster(**kw) as c:
        return c.startup_s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", help="comma-separated hosts for ssh")
    p.add_argument("--ssh-config")
    p.add_argument("--namespaced", type=int, default=0, help="make this many test hosts")
    p.add_argument("--slurm", action="store_true", help="place through Slurm, not SSH")
    p.add_argument("--slurm-job", help="the allocation (default: SLURM_JOB_ID)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if not (args.hosts or args.namespaced or args.slurm):
        p.error("give --hosts h1,h2,..., --slurm or --namespaced N")
    warnings.simplefilter("ignore", RuntimeWarning)  # the exposure warning, once per start
    with contextlib.ExitStack() as stack:
        job, srun_args = args.slurm_job, ["--overlap"]
        if args.namespaced:
            from tests.hosts import NamespacedHosts, SlurmOnHosts

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            made = stack.enter_context(NamespacedHosts(args.namespaced, folder))
            hosts, ssh_config = made.addresses, str(made.ssh_config)
            if args.slurm:
                slurm = stack.enter_context(SlurmOnHosts(made))
                os.environ.update(slurm.env)
                job, srun_args = slurm.job, ["--overlap", "--overcommit"]
        else:
            hosts, ssh_config = (args.hosts or "").split(","), args.ssh_config
        how = "through Slurm" if args.slurm else "over ssh"

        def placement():
            if args.slurm:
                return Slurm(job, srun_args=srun_args)
            return SSH(hosts, ssh_config=ssh_config)

        here, placed = [], []
        for i in range(args.repeats):
            here.append(startup(workers=args.workers))
            placed.append(startup(workers=args.workers, placement=placement()))
            print(f"round {i + 1}: here {here[-1]:.2f} s, {how} {placed[-1]:.2f} s", flush=True)
    a, b = statistics.median(here), statistics.median(placed)
    print(
        f"1 PS + {args.workers} workers, median of {args.repeats}: here {a:.2f} s, "
        f"{how} {b:.2f} s: ratio {b / a:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
