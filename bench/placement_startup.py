"""Start-up of a cluster placed on other hosts against the same cluster on this machine.

    python -m bench.placement_startup --hosts lab1,lab2,lab3 [--ssh-config F] [--workers 4]
    python -m bench.placement_startup --namespaced 3     # root: hosts made as the tests make them

Starts `LocalCluster(workers=N)` (1 PS) here and placed over SSH, alternating, `--repeats`
times each, and prints each start-up, the medians and their ratio (placed / here), measured in
one run. `--namespaced` makes network-namespace hosts with an sshd each (tests/hosts.py).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import warnings
from pathlib import Path

from helpers.cluster import LocalCluster
from helpers.cluster.placement import SSH


def startup(**kw) -> float:
    with LocalCluster(**kw) as c:
        return c.startup_s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", help="comma-separated hosts for ssh")
    p.add_argument("--ssh-config")
    p.add_argument("--namespaced", type=int, default=0, help="make this many test hosts")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if not args.hosts and not args.namespaced:
        p.error("give --hosts h1,h2,... or --namespaced N")
    warnings.simplefilter("ignore", RuntimeWarning)  # the exposure warning, once per start
    with contextlib.ExitStack() as stack:
        if args.namespaced:
            from tests.hosts import NamespacedHosts

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            made = stack.enter_context(NamespacedHosts(args.namespaced, folder))
            hosts, ssh_config = made.addresses, str(made.ssh_config)
        else:
            hosts, ssh_config = args.hosts.split(","), args.ssh_config
        here, placed = [], []
        for i in range(args.repeats):
            here.append(startup(workers=args.workers))
            placed.append(
                startup(workers=args.workers, placement=SSH(hosts, ssh_config=ssh_config))
            )
            print(f"round {i + 1}: here {here[-1]:.2f} s, over ssh {placed[-1]:.2f} s", flush=True)
    a, b = statistics.median(here), statistics.median(placed)
    print(
        f"1 PS + {args.workers} workers, median of {args.repeats}: here {a:.2f} s, "
        f"on {len(hosts)} hosts over ssh {b:.2f} s: ratio {b / a:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
