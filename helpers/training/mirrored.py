"""Train LeNet under MirroredStrategy, one configuration per child process.

Notebook 04 compares many (replicas, batch, learning rate) configurations. Every
configuration runs in its own process (`python -m helpers.training.mirrored job.json`): it
sets up exactly the devices it needs, trains, measures its own CPU% and peak memory, and prints
one JSON line (on Linux it is forked from a server that has imported TensorFlow: `fork_server`).
A process killed by a signal costs one configuration: it is reported with its
Python stack (faulthandler) and run once more. Test accuracy comes from plain forward passes
(`models.accuracy`), not Keras' `evaluate`, which under a strategy can crash TensorFlow's
runtime (bench/mirrored_crash_repro.py reproduces it and says why). The process plumbing
(dying with the parent, one process group, log tails) is helpers/system/processes.py.

What the lesson is about, the strategy and its scope, is `train_one_config` below: short
enough to read with `mirrored.train_one_config??`.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import queue
import re
import signal
import sys
import time

from helpers import config
from helpers.system.control import Event, event_line

EVALUATE = ("epoch", "end")
# what a configuration's process imports besides TensorFlow and Keras: its fork server does first
PRELOAD = ("helpers.training.mirrored", "helpers.training.models", "helpers.data.arrays",
           "helpers.system.resources", "helpers.data.mnist:hold")  # fmt: skip


class MirroredRunError(RuntimeError):
    """A configuration's process failed twice, or timed out."""


def device_kind() -> str:
    """ "GPU" when TF sees two or more GPUs (one replica each), else "CPU" (logical devices)."""
    import tensorflow as tf

    return "GPU" if len(tf.config.list_physical_devices("GPU")) >= 2 else "CPU"


def max_replicas(wanted: int) -> int:
    """How many of `wanted` replicas this machine gives: one per GPU, or any number of CPUs."""
    import tensorflow as tf

    return (
        min(wanted, len(tf.config.list_physical_devices("GPU")))
        if device_kind() == "GPU"
        else wanted
    )


def configure_devices(count: int) -> list[str]:
    """Make `count` devices for replicas and return their names (call before any TF op).

    With two or more GPUs: the first `count` GPUs. Otherwise the CPU split into `count`
    logical devices: they share the same cores, so they show the mechanics, not a speed-up.
    """
    import tensorflow as tf

    if device_kind() == "GPU":
        available = max_replicas(count)
        if count > available:
            raise ValueError(
                f"{count} replicas asked for, but only {available} GPUs are visible: "
                f"use at most {available}"
            )
        tf.config.set_visible_devices(tf.config.list_physical_devices("GPU")[:count], "GPU")
        return [d.name for d in tf.config.list_logical_devices("GPU")]
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration() for _ in range(count)],
    )
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def strategy_over(devices: list[str]):
    """A MirroredStrategy with one replica per device.

    GPUs use the default all-reduce (NCCL). Logical CPUs reduce onto the first device: the
    default collective all-reduce assigns group keys per strategy, and a second strategy over
    another number of CPU devices in the same process clashes with the first.
    """
    import tensorflow as tf

    if "GPU" in devices[0].upper():
        return tf.distribute.MirroredStrategy(devices)
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0])
    )


def round_batch(batch: int, replicas: int) -> int:
    """The global batch rounded up to a multiple of the replicas (equal shares per replica)."""
    return math.ceil(batch / replicas) * replicas


def job(
    replicas: int,
    optimizer,
    batches,
    n: int,
    evaluate: str = "end",
    test_size: int = 10_000,
    seed: int = 42,
    warmup: bool = True,
) -> dict:
    """Describe one configuration as a JSON-able dict, checking every value first.

    Args:
        replicas: number of devices the model is mirrored on (>= 1).
        optimizer: a Keras optimizer (its config, schedule included, goes to the child).
        batches: the global batch size of each epoch (rounded up to a multiple of replicas).
        n: examples per epoch (the largest multiple of the batch that fits is used).
        evaluate: "epoch" to test after every epoch, "end" to test once at the end.
        test_size: test examples to evaluate on.
        seed: seeds the weights and the shuffling.
        warmup: fit two untimed batches of every batch size first (then restore the initial
            weights and the optimizer's state), so tracing the step function is not timed.
    Raises:
        ValueError: naming the bad value.
    """
    import keras

    for name, value in (("replicas", replicas), ("n", n), ("test_size", test_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    batches = list(batches)
    if not batches or any(
        isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= n for b in batches
    ):
        raise ValueError(
            f"batches must list one batch size per epoch, each from 1 to n={n}, got {batches!r}"
        )
    if evaluate not in EVALUATE:
        raise ValueError(f"evaluate must be one of {EVALUATE}, got {evaluate!r}")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"optimizer must be a Keras optimizer, got {optimizer!r}")
    return {
        "replicas": replicas,
        "optimizer": keras.optimizers.serialize(optimizer),
        "batches": [round_batch(b, replicas) for b in batches],
        "n": n,
        "evaluate": evaluate,
        "test_size": test_size,
        "seed": seed,
        "warmup": warmup,
    }


def epoch_timer():
    """A Keras callback that keeps the seconds of the last epoch fit ran in `.seconds` (Keras is
    imported here, when a configuration runs, as everywhere in this module)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.t0

    return EpochTimer()


def train_one_config(spec: dict) -> dict:
    """Run one configuration in this process; return its timings, accuracies and resource use."""
    strategy = strategy_over(configure_devices(spec["replicas"]))  # before any other TF op
    import keras

    from helpers.data.arrays import load_arrays
    from helpers.system.resources import ResourceMonitor
    from helpers.training.models import accuracy, build

    config.set_seed(spec["seed"])
    x, y, xt, yt, _ = load_arrays("mnist", spec["n"], spec["test_size"], spec["seed"])  # these rows
    x, xt = x[..., None], xt[..., None]
    with strategy.scope():  # variables and optimizer slots: one copy per replica
        model = build("lenet", (28, 28, 1), 10, spec["seed"])
        model.compile(
            optimizer=keras.optimizers.deserialize(spec["optimizer"]),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    batches = spec["batches"]
    if spec["warmup"]:  # trace the step for every batch size, so no timed epoch traces it
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        weights, state = model.get_weights(), [v.numpy() for v in model.optimizer.variables]
        for size in dict.fromkeys(batches):
            model.fit(x[: 2 * size], y[: 2 * size], batch_size=size, verbose=0)
        model.set_weights(weights)
        for variable, value in zip(model.optimizer.variables, state):  # step count, momenta
            variable.assign(value)
    out = {
        "replicas": strategy.num_replicas_in_sync,
        "devices": list(strategy.extended.worker_devices),
        "pid": os.getpid(),
        "batch": batches,
        "examples": [],
        "epoch_s": [],
        "fit_s": [],
        "test_acc": [],
    }
    # The epoch is timed by Keras' own epoch callbacks. The `fit` call around it also builds
    # and tears down the distributed input pipeline; tearing it down (TF's MultiDeviceIterator)
    # waits for each device's prefetch thread, which on logical CPUs can take seconds with the
    # CPU idle. That is the fit call's time, not the epoch's: fit_s.
    timer = epoch_timer()
    with ResourceMonitor(interval=0.2) as monitor:
        for epoch, batch in enumerate(batches):
            m = (spec["n"] // batch) * batch
            t0 = time.perf_counter()
            model.fit(
                x[:m],
                y[:m],
                batch_size=batch,
                epochs=epoch + 1,
                initial_epoch=epoch,
                shuffle=True,
                verbose=0,
                callbacks=[timer],
            )
            out["fit_s"].append(time.perf_counter() - t0)
            out["epoch_s"].append(timer.seconds)
            out["examples"].append(m)
            if spec["evaluate"] == "epoch" or epoch == len(batches) - 1:
                # not model.evaluate (bench/mirrored_crash_repro.py): forward passes only
                out["test_acc"].append(accuracy(model, xt, yt, batch=1000))
    out["steps"] = int(model.optimizer.iterations.numpy())  # the timed epochs' steps only
    return {**out, **monitor.summary()[os.getpid()]}


def fork_server(env: dict):
    """The fork server this process's configurations are forked from (its shared one for them,
    helpers.system.forkserver.shared), or None where each is spawned: macOS, LABS_FORK=0, or a
    GPU, whose driver must not be set up before a fork. It imports TensorFlow once for every
    configuration and lives until `end_fork_server()` or until this process ends: each
    configuration still starts from a process that has run nothing, so its time and memory
    stay its own."""
    import tensorflow as tf

    from helpers.system import forkserver

    if not forkserver.enabled() or tf.config.list_physical_devices("GPU"):
        return None
    return forkserver.shared(env, PRELOAD, config.runs_dir("mirrored"))


def end_fork_server() -> None:
    """End this process's fork servers (forkserver.end_shared), once their children ended."""
    from helpers.system import forkserver

    forkserver.end_shared()


def run(spec: dict, retries: int = 1, timeout: float = 900.0, name: str = "mirrored") -> dict:
    """Run one configuration (a `job(...)` dict) in a child process; return its result.

    A child killed by a signal (a TF runtime crash) is reported on stdout and run again, up to
    `retries` more times; the result's "attempts" says how many it took.

    Raises:
        MirroredRunError: the last attempt failed, or one ran past `timeout` seconds; the
            message has the signal or exit code and the tail of the child's log.
    """
    from helpers.system.processes import ChildProcess, NoResult, log_tail, wait_for_results

    folder = config.runs_dir("mirrored")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    job_file = folder / f"{name}-{os.getpid()}.json"
    job_file.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for attempt in range(1, retries + 2):
        inbox: queue.Queue = queue.Queue()
        log = folder / f"{name}-{os.getpid()}-{attempt}.log"
        cmd = [sys.executable, "-m", "helpers.training.mirrored", str(job_file)]
        child = ChildProcess(
            name, cmd, dict(env, LABS_MIRRORED_ATTEMPT=str(attempt)), log, inbox, fork_server(env)
        )
        try:
            result = wait_for_results({name: child}, inbox, [name], timeout)[name]
            return {**result, "attempts": attempt}
        except NoResult as exc:
            how = exc.how
        finally:
            child.kill()  # by PID, also on Ctrl-C
        if how.startswith("timed out") or attempt > retries:
            raise MirroredRunError(
                f"{name}: the child process {how} (attempt {attempt} of "
                f"{retries + 1})\n--- last lines of {log} ---\n{log_tail(log)}"
            )
        print(f"{name}: the child process {how}; running it once more", flush=True)


def _inject_fault(spec: dict) -> None:
    """Kill this process with the signal the job names, on the attempts it names (for tests)."""
    fault = spec.get("fault")
    if fault and int(os.environ.get("LABS_MIRRORED_ATTEMPT", "1")) in fault["attempts"]:
        os.kill(os.getpid(), getattr(signal, fault["signal"]))


def main(argv: list[str]) -> None:
    from helpers.system.processes import lean_keras_import, watch_lifeline

    lean_keras_import()
    watch_lifeline()  # end with the kernel that started this configuration, on any system
    faulthandler.enable(all_threads=True)  # a crash prints every thread's Python stack to the log
    spec = json.loads(open(argv[0]).read())
    _inject_fault(spec)
    print(event_line(Event.DONE, result=train_one_config(spec)), end="", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
