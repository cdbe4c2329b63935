"""Reproduce notebook 04's kernel death: many MirroredStrategy fits in one long-lived process.

Until the fix, notebook 04 trained every configuration in its one kernel: strategies over 1, 2
and 4 logical CPU devices, a fresh LeNet per configuration, about thirty `model.fit` calls.
In full mode the kernel sometimes died with SIGSEGV inside a TF compute thread. Each trial
here is a fresh Python process that repeats that pattern (the timing grid, then the four
SGD-momentum learning-rate-scaling runs on 4 replicas, where the crash was seen) for a number
of rounds. The parent prints how each trial ended (ok, or the signal that killed it) and
writes runs/bench/mirrored_crash.json.

    python bench/mirrored_crash_repro.py --trials 4 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def trial(rounds: int, n: int) -> None:
    """One process: the old notebook 04, in miniature, `rounds` times over."""
    import tensorflow as tf

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4)
    import keras

    from helpers.models import build
    from helpers.data import load_mnist

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategies = {r: tf.distribute.MirroredStrategy(
        devices[:r], cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0]))
        for r in (1, 2, 4)}
    (x, y), _ = load_mnist()
    x = (x[:n, ..., None] / 255.0).astype("float32")
    y = y[:n].astype("int32")

    def fit(replicas, optimizer, batch):
        with strategies[replicas].scope():
            model = build("lenet", (28, 28, 1), 10, seed=0)
            model.compile(optimizer=optimizer(), metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)

    for r in range(rounds):
        for replicas in (1, 2, 4):
            for batch in (32, 512):
                fit(replicas, keras.optimizers.Adam, batch)
        for batch, lr in ((64, 0.005), (512, 0.005), (512, 0.04), (512, 0.04)):
            fit(4, lambda: keras.optimizers.SGD(lr, momentum=0.9), batch)
        print(f"round {r + 1}/{rounds} done", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4, help="fresh processes to run")
    parser.add_argument("--rounds", type=int, default=2, help="repeats of the pattern per process")
    parser.add_argument("--n", type=int, default=12_000, help="training examples per fit")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per trial")
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trial:
        trial(args.rounds, args.n)
        return 0
    from helpers.processes import child_setup

    out = ROOT / "runs" / "bench" / "mirrored_crash.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for i in range(args.trials):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--trial", "--rounds", str(args.rounds),
                                 "--n", str(args.n)], stderr=subprocess.DEVNULL,
                                preexec_fn=child_setup)  # dies with this process
        try:
            rc = proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        end = "ok" if rc == 0 else (f"killed by {signal.Signals(-rc).name}" if rc < 0
                                     else f"exited with code {rc}")
        results.append({"trial": i + 1, "end": end, "seconds": round(time.perf_counter() - t0, 1)})
        print(f"trial {i + 1}/{args.trials}: {end} after {results[-1]['seconds']} s", flush=True)
        out.write_text(json.dumps({"args": vars(args), "trials": results}, indent=1))
    crashed = sum(r["end"] != "ok" for r in results)
    print(f"{crashed}/{len(results)} trials crashed; details in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
