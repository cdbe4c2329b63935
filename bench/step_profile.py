"""Where one engine step's time goes (issue 12): the engine's own event logs, and the floor
costs of the remote calls a step is made of, measured on this machine.

Part 1 trains async on one worker + PS (logistic regression and LeNet) and splits each worker
step, from its event log, into the step function (pull, gradient, push: one tf.function) and
the Python loop around it. (In async the workers apply their own gradients on the PS inside
the step function, so the PS's loop is off the step's path: it only numbers the updates.)
Part 2 starts one TF server (the PS) and times, from this process, a local empty call, one
remote read of a scalar, a remote read of the logistic regression's parameters, and one call
that reads them and applies a gradient on the PS (what an async worker applying its own
gradient would do), next to the local gradient computation. Part 2's server is not in a
private network namespace: the measuring process must reach it.
Writes runs/bench/step_profile.json and prints a markdown table.
Usage: python bench/step_profile.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE", "false")

from cluster_bench import BATCH, LR, TRAIN_SIZE, one_process  # noqa: E402  (same work)
from helpers import config, files  # noqa: E402
from helpers.cluster import LocalCluster, tfconfig  # noqa: E402


def ms(values) -> float:
    """Median of seconds, in milliseconds."""
    return 1000 * statistics.median(values)


def engine_steps(steps: dict) -> dict:
    """Per model: median ms of a worker step (interval between steps), of its step function
    (compute_s: pull + gradient + apply on the PS), and of the loop around it."""
    out = {}
    with LocalCluster(workers=1, isolate="auto") as c:
        for model, n in steps.items():
            run = c.train(mode="async", model=model, steps=n, lr=LR[model], batch_size=BATCH,
                          train_size=TRAIN_SIZE, test_size=500, progress=False, seed=0)
            ev = run.events
            st = ev[ev.kind == "step"].sort_values("t").iloc[10:]  # after the first steps
            interval = st.t.diff().dropna()
            out[model] = {"step_ms": ms(interval), "step_function_ms": ms(st.compute_s),
                          "loop_ms": ms(interval) - ms(st.compute_s),
                          "steps_per_s": run.summary()["steps_per_s"]}
    return out


def remote_costs(repeats: int) -> dict:
    """Median ms of the calls a step is made of, against a real PS server on this machine.

    The server is a TF_CONFIG task; the calls are made by a child process (`--remote`), which
    ends before the server does (a client that outlives its server logs errors at exit)."""
    with tfconfig.TFConfigCluster({"worker": 1, "ps": 1}, {"kind": "server"},
                                  servers=("ps",), timeout=120, isolate=False) as cl:
        cmd = [sys.executable, __file__, "--remote", cl.cluster["ps"][0], "--repeats",
               str(repeats)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"the remote-call measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_calls(ps_addr: str, repeats: int) -> dict:
    """In this process, connected to the PS at `ps_addr`: median ms of each kind of call."""
    import keras
    import tensorflow as tf

    from helpers import models

    x, y, _, _, _ = models.load_arrays("mnist", BATCH, 1, 0, images=("train",))
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": [ps_addr]}))
    ps = "/job:ps/replica:0/task:0/device:CPU:0"
    with tf.device(ps):
        int(tf.constant(1) + 1)  # blocks until the PS answers (as helpers.cluster.node does)
    model = models.build("logreg", x.shape[1:], 10, 0)
    with tf.device(ps):
        scalar = tf.Variable(0.0)
        params = [tf.Variable(v.numpy()) for v in model.trainable_variables]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def empty():
        return tf.constant(0.0)

    @tf.function
    def read_scalar():
        return scalar.read_value()

    @tf.function
    def read_params():
        return [p.read_value() for p in params]

    @tf.function
    def local_grad(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def read_grad_apply(xb, yb):  # pull, local gradient, apply on the PS: one call
        for var, p in zip(model.trainable_variables, params):
            var.assign(p.read_value())
        for p, g in zip(params, local_grad(xb, yb)):
            p.assign_sub(0.1 * g)
        return tf.constant(0.0)

    calls = {"local_empty_call_ms": lambda: empty(),
             "remote_read_scalar_ms": lambda: read_scalar(),
             "remote_read_params_ms": lambda: read_params(),
             "local_gradient_ms": lambda: local_grad(x, y),
             "pull_gradient_apply_one_call_ms": lambda: read_grad_apply(x, y)}
    out = {}
    for name, call in calls.items():
        call()  # trace
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            tf.nest.map_structure(lambda v: v.numpy(), call())
            times.append(time.perf_counter() - t)
        out[name] = ms(times)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and calls (a smoke run)")
    p.add_argument("--remote", metavar="PS_ADDR", help=argparse.SUPPRESS)  # the child's part
    p.add_argument("--repeats", type=int, default=400, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.remote:
        print(json.dumps(measure_calls(args.remote, args.repeats)))
        return
    steps = {"logreg": 200, "lenet": 60} if args.quick else {"logreg": 800, "lenet": 200}
    out = {"machine_cores": os.cpu_count(), "load_average_start": os.getloadavg()}
    base = {m: one_process(m, n) for m, n in steps.items()}
    out["one_process_step_ms"] = {m: 1000 / v for m, v in base.items()}
    out["engine_async_1w"] = engine_steps(steps)
    out["remote_costs"] = remote_costs(100 if args.quick else 400)
    out["load_average_end"] = os.getloadavg()
    files.write_json(config.runs_dir("bench") / "step_profile.json", out, indent=1)
    print("| model | one process step ms | engine step ms | of which step function | "
          "loop | engine steps/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for m, e in out["engine_async_1w"].items():
        print(f"| {m} | {out['one_process_step_ms'][m]:.2f} | {e['step_ms']:.2f} | "
              f"{e['step_function_ms']:.2f} | {e['loop_ms']:.2f} | "
              f"{e['steps_per_s']:.0f} |")
    print("\n| call (logistic regression, batch %d) | median ms |\n| --- | ---: |" % BATCH)
    for name, value in out["remote_costs"].items():
        print(f"| {name} | {value:.2f} |")
    print("\nload average at start and end:", out["load_average_start"], out["load_average_end"])


if __name__ == "__main__":
    main()
