"""Where one engine step's time goes (issue 12): the engine's own event logs, and the floor
costs of the remote calls a step is made of, measured on this machine.

Part 1 trains async on one worker + PS (logistic regression and LeNet) and splits each worker
step, from its event log, into the step function (pull, gradient, push: one tf.function) and
the Python loop around it. (In async the workers apply their own gradients on the PS inside
the step function, so the PS's loop is off the step's path: it only numbers the updates.)
Each engine run alternates with one process's plain SGD on the same model and data, three
rounds (two with --quick): the engine's ratio to one process is the median of the rounds'
ratios, so that both figures see the machine's drift alike.
Part 2 starts one TF server (the PS) and times, from this process, a local empty call and one
remote read of a scalar; then, for each model, the local gradient, a remote read of the
parameters, one call that pulls, computes and applies on the PS (the shape of the engine's async
step), one call that takes an already computed gradient to the PS and brings the parameters
back, and the gradient, push and read-back as one call: the floor of an async step that never
computes on parameters older than the last update, timed against one process's step in
alternating blocks for the ceiling of the async_1w ratios. Part 2's server is not in a private
network namespace: the measuring process must reach it.
Part 3 times the step's stamps: async on one worker + PS with the stamps (tf.timestamp() reads,
the default) and with them replaced by constants (LABS_BENCH_NO_STAMPS=1, for this comparison
only), two clusters, their runs alternating, the order swapped each round.
Writes runs/bench/step_profile.json and prints a markdown table.
Usage: python -m bench.step_profile [--quick]
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

from bench.workload import BATCH, LR, TRAIN_SIZE, one_process  # noqa: E402  (same work)
from helpers import config, files  # noqa: E402
from helpers.cluster import LocalCluster, tfconfig  # noqa: E402


def ms(values) -> float:
    """Median of seconds, in milliseconds."""
    return 1000 * statistics.median(values)


def engine_steps(steps: dict, rounds: int = 3) -> dict:
    """Per model: median ms of a worker step (interval between steps), of its step function
    (compute_s: pull + gradient + apply on the PS), and of the loop around it; and one
    process's step, timed in the same rounds, alternating with the engine's runs, so that
    both see the machine alike (of_one_process: the median of the rounds' ratios)."""
    out = {}
    with LocalCluster(workers=1, isolate="auto") as c:
        for model, n in steps.items():
            rows = []
            for _ in range(rounds):
                one_ms = 1000 / one_process(model, n)
                run = _async_run(c, model, n)
                step_ms, compute_ms = _step_ms(run)
                rows.append((one_ms, step_ms, compute_ms, run.summary()["steps_per_s"]))
            one, step, function, rate = (statistics.median(r[k] for r in rows) for k in range(4))
            out[model] = {
                "step_ms": step,
                "step_function_ms": function,
                "loop_ms": step - function,
                "steps_per_s": rate,
                "one_process_step_ms": one,
                "of_one_process": statistics.median(r[0] / r[1] for r in rows),
                "rounds": rounds,
            }
    return out


def _async_run(cluster, model: str, n: int):
    """The benchmark's async run: `n` updates of `model`, the workload's settings."""
    return cluster.train(
        mode="async",
        model=model,
        steps=n,
        lr=LR[model],
        batch_size=BATCH,
        train_size=TRAIN_SIZE,
        test_size=500,
        progress=False,
        seed=0,
    )


def _step_ms(run) -> tuple[float, float]:
    """Median ms between a run's worker steps (after its first 10), and of their step call."""
    ev = run.events
    st = ev[ev.kind == "step"].sort_values("t").iloc[10:]
    return ms(st.t.diff().dropna()), ms(st.compute_s)


def stamp_cost(steps: dict, rounds: int) -> dict:
    """Per model: median ms of an async step (1 worker) with the step's stamps and without
    (constants instead: worker.NO_STAMPS_ENV), two clusters, runs alternating, and the
    median of the rounds' differences."""
    from helpers.cluster.worker import NO_STAMPS_ENV

    clusters = {}
    try:  # a node keeps the environment it started with, and reads the switch in it as it traces
        os.environ.pop(NO_STAMPS_ENV, None)
        clusters[True] = LocalCluster(workers=1, isolate="auto").start()
        os.environ[NO_STAMPS_ENV] = "1"
        clusters[False] = LocalCluster(workers=1, isolate="auto").start()
        os.environ.pop(NO_STAMPS_ENV)
        out = {}
        for model, n in steps.items():
            got = {True: [], False: []}
            for r in range(rounds):
                for stamped in (True, False) if r % 2 == 0 else (False, True):
                    got[stamped].append(_step_ms(_async_run(clusters[stamped], model, n))[0])
            out[model] = {
                "stamped_step_ms": statistics.median(got[True]),
                "unstamped_step_ms": statistics.median(got[False]),
                "stamps_ms": statistics.median(a - b for a, b in zip(got[True], got[False])),
                "rounds": rounds,
            }
        return out
    finally:
        os.environ.pop(NO_STAMPS_ENV, None)
        for c in clusters.values():
            c.stop()


def remote_costs(repeats: int) -> dict:
    """Median ms of the calls a step is made of, against a real PS server on this machine.

    The server is a TF_CONFIG task; the calls are made by a child process (`--remote`), which
    ends before the server does (a client that outlives its server logs errors at exit)."""
    with tfconfig.TFConfigCluster(
        {"worker": 1, "ps": 1}, {"kind": "server"}, servers=("ps",), timeout=120, isolate=False
    ) as cl:
        cmd = [
            sys.executable,
            "-m",
            "bench.step_profile",
            "--remote",
            cl.cluster["ps"][0],
            "--repeats",
            str(repeats),
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=600, cwd=config.REPO_ROOT
        )
    if done.returncode:
        raise RuntimeError(f"the remote-call measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_calls(ps_addr: str, repeats: int) -> dict:
    """In this process, connected to the PS at `ps_addr`: median ms of each kind of call.

    Besides an empty local call and the smallest remote call, per model (model_calls): the
    local gradient and the calls an async step could be made of."""
    import tensorflow as tf

    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": [ps_addr]}))
    ps_device = "/job:ps/replica:0/task:0/device:CPU:0"
    with tf.device(ps_device):
        int(tf.constant(1) + 1)  # blocks until the PS answers (as helpers.cluster.node does)
        scalar = tf.Variable(0.0)

    @tf.function
    def empty():
        return tf.constant(0.0)

    @tf.function
    def read_scalar():
        return scalar.read_value()

    def timed(call) -> float:
        call()  # trace
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            tf.nest.map_structure(lambda v: v.numpy(), call())
            times.append(time.perf_counter() - t)
        return ms(times)

    out = {"local_empty_call_ms": timed(empty), "remote_read_scalar_ms": timed(read_scalar)}
    for name in ("logreg", "lenet"):
        prefix = "" if name == "logreg" else "lenet_"
        out.update({prefix + k: v for k, v in model_calls(name, ps_device, timed, repeats).items()})
    return out


def model_calls(name: str, ps_device: str, timed, repeats: int) -> dict:
    """Median ms, for one model, of:
    - local_gradient_ms: the gradient of one batch, here;
    - remote_read_params_ms: one read of the parameters on the PS;
    - pull_gradient_apply_one_call_ms: one call that pulls, computes here and applies on the PS
      (the shape of the engine's async step, without its tickets and event log);
    - push_gradient_read_params_ms: a gradient already computed here goes to the PS, is applied
      there, and the parameters come back, one packed transfer each way (wire.pack_by_dtype);
    - gradient_push_read_one_call_ms: both in one call: the gradient of one batch on the
      parameters held here, pushed, applied, and the parameters read back. That is all a step
      must do if it never computes on parameters older than the last update (with one worker),
      in the fewest calls and transfers: the floor of such a step on this machine;
    and staleness_free_ceiling: one process's step (plain SGD here, no cluster) over that floor,
    timed in alternating blocks of 10 calls in this one process, so that a machine whose speed
    drifts slows both alike (median of the blocks' ratios). No async step that never computes
    on parameters older than the last update can beat one process by more than this.
    """
    import keras
    import tensorflow as tf

    from helpers.cluster.wire import pack_by_dtype, unpack
    from helpers.data import arrays
    from helpers.training import models

    x, y, _, _, _ = arrays.load_arrays("mnist", BATCH, 1, 0, images=("train",))
    model = models.build(name, x.shape[1:], 10, 0)
    variables = model.trainable_variables
    shapes = [tuple(v.shape) for v in variables]
    here = variables[0].value.device  # this process's CPU (a Keras variable holds a tf one)
    with tf.device(ps_device):
        params = [tf.Variable(v.numpy()) for v in variables]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def gradient(xb, yb):  # on the parameters held here
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, variables)

    def pull():  # the PS's parameters, one packed transfer, into the ones held here
        with tf.device(ps_device):
            packed = pack_by_dtype([p.read_value() for p in params])
        with tf.device(here):
            for var, value in zip(variables, unpack(packed, shapes)):
                var.assign(value)
        return tf.constant(0.0)

    def push(grads):  # one packed transfer to the PS, applied there
        with tf.device(here):
            packed = pack_by_dtype(grads)
        with tf.device(ps_device):
            for p, g in zip(params, unpack(packed, shapes)):
                p.assign_sub(0.1 * g)
            return [p.value() for p in params]

    def push_then_pull(grads):
        with tf.control_dependencies(push(grads)):
            return pull()

    def pull_then_push(xb, yb):
        with tf.control_dependencies([pull()]):
            grads = gradient(xb, yb)
        with tf.control_dependencies(push(grads)):
            return tf.constant(0.0)

    local_grad = tf.function(gradient)
    read_params = tf.function(lambda: [p.read_value() for p in params])
    pull_gradient_apply = tf.function(pull_then_push)
    push_read = tf.function(push_then_pull)
    gradient_push_read = tf.function(lambda xb, yb: push_then_pull(gradient(xb, yb)))

    @tf.function
    def one_process_step(xb, yb):  # the bench's baseline: plain SGD on the parameters here
        for var, g in zip(variables, gradient(xb, yb)):
            var.assign_sub(0.01 * g)
        return tf.constant(0.0)

    def block(call) -> float:
        t = time.perf_counter()
        for _ in range(10):
            call(x, y).numpy()
        return time.perf_counter() - t

    one_process_step(x, y).numpy(), gradient_push_read(x, y).numpy()  # trace
    ceiling = statistics.median(
        block(one_process_step) / block(gradient_push_read) for _ in range(max(1, repeats // 10))
    )
    grads = local_grad(x, y)
    return {
        "staleness_free_ceiling": ceiling,
        "local_gradient_ms": timed(lambda: local_grad(x, y)),
        "remote_read_params_ms": timed(read_params),
        "pull_gradient_apply_one_call_ms": timed(lambda: pull_gradient_apply(x, y)),
        "push_gradient_read_params_ms": timed(lambda: push_read(grads)),
        "gradient_push_read_one_call_ms": timed(lambda: gradient_push_read(x, y)),
    }


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
    out["engine_async_1w"] = engine_steps(steps, 2 if args.quick else 3)
    out["remote_costs"] = remote_costs(100 if args.quick else 400)
    out["stamps"] = stamp_cost(steps, 4 if args.quick else 8)
    out["load_average_end"] = os.getloadavg()
    files.write_json(config.runs_dir("bench") / "step_profile.json", out, indent=1)
    print(
        "| model | one process step ms | engine step ms | of which step function | "
        "loop | engine steps/s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for m, e in out["engine_async_1w"].items():
        print(
            f"| {m} | {e['one_process_step_ms']:.2f} | {e['step_ms']:.2f} | "
            f"{e['step_function_ms']:.2f} | {e['loop_ms']:.2f} | "
            f"{e['steps_per_s']:.0f} |"
        )
    print(
        "\n| call (batch %d; lenet_: LeNet, else logistic regression) | median ms |\n"
        "| --- | ---: |" % BATCH
    )
    for name, value in out["remote_costs"].items():
        if name.endswith("_ms"):
            print(f"| {name} | {value:.2f} |")
    for model, prefix in (("logreg", ""), ("lenet", "lenet_")):
        ceiling = out["remote_costs"][prefix + "staleness_free_ceiling"]
        of_one = out["engine_async_1w"][model]["of_one_process"]
        print(
            f"\nceiling of async_1w_{model}_vs_one_process for a staleness-free step: "
            f"{ceiling:.2f}; the engine, timed alternating with one process: {of_one:.2f} of "
            f"one process, {of_one / ceiling:.2f} of the ceiling"
        )
    print("\n| model | step ms with the stamps | without | the stamps' cost (median of rounds) |")
    print("| --- | ---: | ---: | ---: |")
    for m, e in out["stamps"].items():
        print(
            f"| {m} | {e['stamped_step_ms']:.2f} | {e['unstamped_step_ms']:.2f} | "
            f"{e['stamps_ms']:+.2f} ms over {e['rounds']} rounds |"
        )
    print("\nload average at start and end:", out["load_average_start"], out["load_average_end"])


if __name__ == "__main__":
    main()
