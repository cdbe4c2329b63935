"""Reproduce notebook 04's SIGSEGV: Keras' `evaluate` under MirroredStrategy on a busy machine.

The trigger, found with faulthandler stacks of the crashed children (every one ended in
`model.evaluate` -> `EpochIterator.reset`, keras/src/backend/tensorflow/trainer.py:489):
under a distribution strategy, Keras 3's `fit` and `evaluate` first pull one batch through a
fresh distributed iterator to build the model (`_maybe_symbolic_build`), then drop that
iterator at once. Destroying it while its prefetch to the devices is still in flight lets a
TF compute thread jump through freed memory (kernel log: `tf_Compute ... segfault at 1 ip
0000000000000001`). Large evaluation batches and a loaded CPU widen the window.

Each trial is a fresh process that builds LeNet under a one-replica MirroredStrategy and tests
it `--repeats` times on 10,000 MNIST images in batches of 1,000, either with Keras'
`evaluate` or with `helpers.training.models.accuracy` (plain forward passes, no distributed
iterator),
while `--load` busy-loop processes keep the cores loaded. The parent prints how each trial
ended and writes runs/bench/mirrored_crash.json.

    python -m bench.mirrored_crash_repro --trials 10 --load 2
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time

from helpers.config import REPO_ROOT as ROOT

VARIANTS = ("keras_evaluate", "models_accuracy")


def trial(variant: str, repeats: int) -> None:
    """One process: build LeNet under MirroredStrategy, then test it `repeats` times."""
    from helpers.training import mirrored  # quiets TF first

    strategy = mirrored.strategy_over(mirrored.configure_devices(1))
    import keras

    from helpers.data.arrays import load_arrays
    from helpers.training.models import accuracy, build

    _, _, xt, yt, _ = load_arrays("mnist", 1, 10_000, images=("test",))
    xt = xt[..., None]
    with strategy.scope():
        model = build("lenet", (28, 28, 1), 10, seed=0)
        model.compile(
            optimizer="adam",
            metrics=["accuracy"],
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    for _ in range(repeats):
        if variant == "keras_evaluate":
            model.evaluate(xt, yt, batch_size=1000, verbose=0)
        else:
            accuracy(model, xt, yt, batch=1000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=10, help="fresh processes per variant")
    p.add_argument("--repeats", type=int, default=6, help="evaluations per process")
    p.add_argument("--load", type=int, default=2, help="busy-loop processes running meanwhile")
    p.add_argument("--trial", choices=VARIANTS, help=argparse.SUPPRESS)  # a child's own run
    args = p.parse_args()
    if args.trial:
        trial(args.trial, args.repeats)
        return
    from helpers.system.processes import child_setup

    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=child_setup)
        for _ in range(args.load)
    ]
    results = {v: [] for v in VARIANTS}
    try:
        for i in range(args.trials):
            for variant in VARIANTS:  # alternating, so both see the same load
                t0 = time.time()
                cmd = [
                    sys.executable,
                    "-m",
                    "bench.mirrored_crash_repro",
                    "--trial",
                    variant,
                    "--repeats",
                    str(args.repeats),
                ]
                rc = subprocess.run(
                    cmd,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=child_setup,
                    cwd=ROOT,
                ).returncode
                how = signal.Signals(-rc).name if rc < 0 else ("ok" if rc == 0 else f"exit {rc}")
                results[variant].append({"how": how, "seconds": round(time.time() - t0, 1)})
                print(
                    f"trial {i + 1}/{args.trials} {variant:16s} {how} "
                    f"({results[variant][-1]['seconds']} s)",
                    flush=True,
                )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    summary = {
        v: {"trials": len(r), "crashes": sum(x["how"] != "ok" for x in r)}
        for v, r in results.items()
    }
    out = ROOT / "runs" / "bench" / "mirrored_crash.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"args": vars(args), "summary": summary, "trials": results}, indent=1)
    )
    for v, s in summary.items():
        print(
            f"{v:16s} {s['crashes']} crashed of {s['trials']} processes "
            f"({args.repeats} evaluations each, {args.load} busy processes)"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
