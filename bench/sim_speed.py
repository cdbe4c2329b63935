"""How fast the cluster simulator runs: simulated worker steps per second of wall time.

    python -m bench.sim_speed            # 1,000 workers: async x 10,000 updates, the others x 1,000
    python -m bench.sim_speed --workers 100 --updates 100
    python -m bench.sim_speed --numerics   # logistic regression's gradients computed for real:
                                           # async 1,000 x 10,000 and sync 100 x 1,000

Timing only (no numerics). The simulator is one Python thread, so this measures one core.
Target: each run within 60 s on one core of this machine; with numerics, 5 minutes (the time
includes loading MNIST and tracing the gradient). The costs are of the order a
calibration gives for logistic regression on MNIST; a worker's compute varies by 20 % a step.
"""

from __future__ import annotations

import argparse
import time

from helpers.cluster import protocol
from helpers.sim.numerics import Numerics
from helpers.sim.simulator import Costs, simulate

TARGET_S = 60.0
TARGET_NUMERICS_S = 300.0
COSTS = Costs(
    compute_s=0.004, compute_cv=0.2, pull_s=0.001, push_s=0.001, apply_s=0.0005, decide_s=1e-5
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--updates", type=int, default=1000, help="sync, SSP, backup (async: 10x)")
    p.add_argument("--numerics", action="store_true", help="compute the gradients for real")
    args = p.parse_args(argv)
    n = args.workers
    runs = [
        ("async", args.updates * 10, {}),
        ("sync", args.updates, {}),
        ("ssp", args.updates, {"staleness": 2}),
        ("backup", args.updates, {"k": n - max(1, n // 10)}),
    ]
    target = TARGET_NUMERICS_S if args.numerics else TARGET_S
    if args.numerics:
        runs = [("async", args.updates * 10, {}), ("sync", args.updates, {"workers": n // 10})]
    print(f"| mode | workers | updates | worker steps | CPU s | steps/s | within {target:.0f} s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for mode, updates, extra in runs:
        extra = {"workers": n, **extra}
        cfg = protocol.validate(
            protocol.RunConfig(mode=mode, steps=updates, train_size=None, **extra)
        )
        t0 = time.process_time()
        numerics = Numerics(cfg) if args.numerics else None
        result = simulate(cfg, COSTS, numerics=numerics)
        took = time.process_time() - t0  # CPU time of this one thread: the machine's load aside
        steps = sum(result.steps.values())
        print(
            f"| {mode} | {cfg.workers} | {result.updates} | {steps} | {took:.1f} "
            f"| {steps / took:,.0f} | {'yes' if took <= target else 'NO'} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
