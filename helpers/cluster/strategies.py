"""What each TF_CONFIG task runs: MultiWorkerMirroredStrategy, ParameterServerStrategy, servers.

`python -m helpers.cluster.strategies job.json [--parent-pid PID | --remote]` reads its role
from TF_CONFIG (set by helpers.cluster.tfconfig), runs the job and prints one JSON line
{"event": "done", "result": ...} on stdout. Both strategies use a custom training loop: Keras 3's
`model.fit` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585) and Keras 3
dropped ParameterServerStrategy training altogether (keras-team/keras#18624).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from helpers import files
from helpers.data.arrays import load_arrays
from helpers.system.clock import process_started
from helpers.system.control import Event, event_line, event_writer
from helpers.system.netns import loopback_tx_bytes
from helpers.system.processes import die_with_parent, lean_keras_import
from helpers.system.remote import remote_lifeline

# The engine's loader (same seeded subset and scaling) and accuracy (argmax over test batches).
from helpers.training.models import MODELS, accuracy, build

KINDS = ("mwms", "ps", "server")


def validate(job: dict, workers: int = 1) -> dict:
    """Check a job for `workers` replicas before any TF import; raise ValueError if it is bad."""
    if job.get("kind") not in KINDS:
        raise ValueError(f"job kind must be one of {KINDS}, got {job.get('kind')!r}")
    if job["kind"] == "server":
        return job
    if job.get("model", "logreg") not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {job.get('model')!r}")
    runs = job.get("runs", [{}]) if job["kind"] == "mwms" else [{}]
    if not runs:
        raise ValueError("runs must list at least one {'batch_size': ..., 'epochs': ...}")
    sizes = {"train_size": job.get("train_size"), "test_size": job.get("test_size")}
    for run in runs:
        sizes["batch_size"] = run.get("batch_size", job.get("batch_size"))
        for key, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        if job["kind"] == "mwms" and sizes["batch_size"] % workers:
            raise ValueError(
                f"global batch_size {sizes['batch_size']} must be divisible by the "
                f"{workers} workers: use a multiple of {workers}"
            )
    if not job.get("lr", 0) > 0:
        raise ValueError(f"lr must be > 0, got {job.get('lr')!r}")
    return job


def ring_bytes(grad_bytes: int, workers: int) -> float:
    """Bytes each worker sends per ring all-reduce of `grad_bytes`: 2 (N - 1) / N of them."""
    return 2 * (workers - 1) / workers * grad_bytes


def run_mwms(job: dict) -> dict:
    """Train with MultiWorkerMirroredStrategy, once per entry of job["runs"], all in lock-step."""
    import tensorflow as tf

    from helpers.system.resources import ResourceMonitor

    started = process_started()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ready = time.time()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    task, workers = tf_config["task"]["index"], len(tf_config["cluster"]["worker"])
    x, y, xt, yt, _ = load_arrays("mnist", job["train_size"], job["test_size"], job.get("seed", 0))
    job_start, results = time.time(), []
    print(event_line(Event.TRAINING), end="", flush=True)  # for the launcher's log and tests
    for run in job["runs"]:
        with ResourceMonitor(interval=0.25) as monitor:
            result = train_mirrored(strategy, dict(job, **run), x, y, xt, yt, task, workers)
        usage = monitor.summary()[os.getpid()]
        result["times"]["end"] = time.time()  # after the monitor's thread has stopped
        results.append(
            dict(result, cpu_percent=usage["cpu_percent"], peak_rss_mb=usage["peak_rss_mb"])
        )
    return {
        "workers": strategy.num_replicas_in_sync,
        "ready_s": ready - started,
        "runs": results,
        "train_s": sum(r["train_s"] for r in results),
        "eval_s": sum(r["eval_s"] for r in results),
        "times": {
            "started": started,
            "ready": ready,
            "job_start": job_start,
            "result": time.time(),
        },
    }


def train_mirrored(strategy, job: dict, x, y, xt, yt, task: int, workers: int) -> dict:
    """One custom-loop training run under a (multi-worker) mirrored strategy.

    `task` is this worker's index of `workers`: each worker scores its own slice of the test
    set and one all-reduce adds up the hits, so every worker ends the run at the same moment
    with the same accuracy (no worker idles while another evaluates).
    """
    import keras
    import tensorflow as tf

    times = {"start": time.time()}  # wall-clock stamps of the run's parts, for launch.json
    n, batch, seed = strategy.num_replicas_in_sync, job["batch_size"], job.get("seed", 0)
    next_batch = _worker_batches(strategy, x, y, task, workers, batch, seed)
    with strategy.scope():
        model = build(job["model"], (28, 28), 10, seed)
        optimizer = keras.optimizers.get(
            {"class_name": job.get("optimizer", "adam"), "config": {"learning_rate": job["lr"]}}
        )
    train_step, all_workers_sum = _mirrored_steps(strategy, model, optimizer, batch)

    def test_accuracy():
        mine_x, mine_y = xt[task::workers], yt[task::workers]
        hits = round(accuracy(model, mine_x, mine_y) * len(mine_x)) if len(mine_x) else 0
        return float(all_workers_sum(tf.constant(hits, tf.float32))) / len(xt)

    steps = max(1, len(x) // batch)
    grad_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    times["setup_end"] = time.time()  # dataset, model, optimizer (not yet the tracing)
    lo_start = loopback_tx_bytes()  # this namespace's loopback: all workers' traffic
    history, train_s, eval_s = _epochs(
        lambda: train_step(next_batch()), test_accuracy, steps, job.get("epochs", 1)
    )
    times["epochs_end"] = time.time()
    lo_end = loopback_tx_bytes()
    return {
        "workers": n,
        "batch_size": batch,
        "steps_per_epoch": steps,
        "history": history,
        "setup_s": times["setup_end"] - times["start"],
        "train_s": train_s,
        "eval_s": eval_s,
        "test_accuracy": history[-1]["test_accuracy"],
        "grad_bytes": grad_bytes,
        "bytes_sent": ring_bytes(grad_bytes, n) * steps * len(history),  # the formula
        # measured: what crossed the loopback while the epochs ran (training, evaluation,
        # TF's own heartbeats), all workers together; meaningful in a private namespace
        "loopback_bytes": None if lo_start is None or lo_end is None else lo_end - lo_start,
        "weights_checksum": float(
            sum(float(np.abs(v.numpy()).sum()) for v in model.trainable_variables)
        ),
        "times": dict(times, returned=time.time()),
    }


def _worker_batches(strategy, x, y, task: int, workers: int, batch: int, seed: int):
    """Return a function giving this worker's next batch, split over its replicas."""
    import tensorflow as tf

    # Each worker reads its own shard with its own tf.data pipeline: nothing is shipped
    # between them. A plain iterator, not `distribute_datasets_from_function`: under MWMS that
    # wraps the pipeline in a MultiDeviceIterator whose per-device part keeps a tf.data
    # autotuning thread that the iterator's deletion waited out, for many seconds after a run.
    # Without autotuning, deleting this one is quick.
    n = strategy.num_replicas_in_sync
    local_replicas = len(strategy.extended.worker_devices)  # 1 per worker on CPU
    per_replica = tf.distribute.InputContext(workers, task, n).get_per_replica_batch_size(batch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(workers, task)
    ds = ds.shuffle(len(x), seed=seed).repeat()
    ds = ds.batch(per_replica * local_replicas, drop_remainder=True).prefetch(2)
    no_autotune = tf.data.Options()
    no_autotune.autotune.enabled = False
    batches = iter(ds.with_options(no_autotune))

    def next_batch():  # this worker's batch, split over its replicas (one on CPU)
        xb, yb = next(batches)

        def mine(ctx):
            k = ctx.replica_id_in_sync_group - task * local_replicas
            part = slice(k * per_replica, (k + 1) * per_replica)
            return xb[part], yb[part]

        return strategy.experimental_distribute_values_from_function(mine)

    return next_batch


def _mirrored_steps(strategy, model, optimizer, batch: int):
    """Return the training step (one all-reduced update, the loss summed over replicas) and
    a function adding up one value per worker over all workers."""
    import keras
    import tensorflow as tf

    local_replicas = len(strategy.extended.worker_devices)

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(
                yb, model(xb, training=True), from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces grads
        return loss

    @tf.function
    def train_step(xb_yb):
        return strategy.reduce("SUM", strategy.run(replica_step, args=xb_yb), axis=None)

    @tf.function
    def all_workers_sum(value):  # each replica adds its worker's share once
        share = value / local_replicas
        return strategy.reduce("SUM", strategy.run(lambda v: v, args=(share,)), axis=None)

    return train_step, all_workers_sum


def _epochs(train_step, test_accuracy, steps: int, epochs: int):
    """Train `epochs` epochs of `steps` steps, scoring after each; return the history and the
    seconds spent training and evaluating."""
    history, train_s, eval_s = [], 0.0, 0.0
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        losses = [float(train_step()) for _ in range(steps)]
        t1 = time.perf_counter()
        acc = test_accuracy()
        train_s, eval_s = train_s + t1 - t0, eval_s + time.perf_counter() - t1
        history.append(
            {
                "epoch": epoch,
                "loss": float(np.mean(losses)),
                "test_accuracy": acc,
                "train_s": train_s,
            }
        )
    return history, train_s, eval_s


def run_ps(job: dict) -> dict:
    """Coordinate ParameterServerStrategy training: schedule steps on workers, variables on PS.

    `steps` updates are timed after one more that traces the step function.
    """
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    n_ps = len(resolver.cluster_spec().as_dict().get("ps", []))
    # with several PS tasks, each variable is split over them as TF's PS tutorial does
    partitioner = (
        tf.distribute.experimental.partitioners.FixedShardsPartitioner(n_ps) if n_ps > 1 else None
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    started, ready = process_started(), time.time()
    dataset_fn = _rows_dataset_fn(job["data_file"], job["batch_size"])
    with strategy.scope():
        model = build(job.get("model", "logreg"), (28, 28), 10, job.get("seed", 0))
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    step_fn = _ps_step_fn(strategy, model, job["lr"])
    steps, job_start = job["steps"], time.time()
    coordinator.schedule(step_fn, args=(iterator,))  # one update that traces step_fn,
    coordinator.join()  # outside the clock, as the engine's workers trace theirs
    t0 = time.perf_counter()
    remote = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(steps)]
    coordinator.join()
    train_s = time.perf_counter() - t0
    _, _, xt, yt, _ = load_arrays("mnist", 1, job["test_size"], images=("test",))
    # the first and last 20 losses only: each fetch copies a value from its worker
    first, last = ([float(r.fetch()) for r in part] for part in (remote[:20], remote[-20:]))
    t1 = time.perf_counter()
    test_accuracy = accuracy(model, xt, yt)
    return {
        "workers": len(resolver.cluster_spec().as_dict().get("worker", [])),
        "steps": steps,
        "ps": n_ps,
        "shards": [len(getattr(v.value, "variables", [v])) for v in model.trainable_variables],
        "ready_s": ready - started,
        "train_s": train_s,
        "steps_per_s": steps / train_s,
        "loss_first": float(np.mean(first)),
        "loss_last": float(np.mean(last)),
        "test_accuracy": test_accuracy,
        "eval_s": time.perf_counter() - t1,
        "times": {
            "started": started,
            "ready": ready,
            "job_start": job_start,
            "result": time.time(),
        },
    }


def _rows_dataset_fn(path: str, batch: int):
    """Return a dataset_fn reading write_mnist_rows's file: traced here, run on each worker,
    which reads the file there."""
    import tensorflow as tf

    def dataset_fn():
        raw = tf.io.decode_raw(tf.io.read_file(path), tf.uint8)
        n = tf.size(raw) // 785
        rows = tf.reshape(raw, [n, 785])
        images = tf.cast(tf.reshape(rows[:, 1:], [n, 28, 28]), tf.float32) / 255.0
        labels = tf.cast(rows[:, 0], tf.int32)
        ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(10_000).repeat()
        return ds.batch(batch, drop_remainder=True).prefetch(2)

    return dataset_fn


def _ps_step_fn(strategy, model, lr: float):
    """Return the step function a worker runs: the gradient of its next batch, applied with
    plain SGD on the PS as each step lands."""
    import keras
    import tensorflow as tf

    # the tf.Variables behind Keras 3's variables: with a partitioner each is a ShardedVariable,
    # whose shards (one per PS) are what a gradient can be taken for and applied to; Keras's
    # own wrapper has no `handle` for a GradientTape then
    weights = [
        shard
        for v in model.trainable_variables
        for shard in getattr(v.value, "variables", [v.value])
    ]

    @tf.function
    def step_fn(it):
        def replica_fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(
                        yb, model(xb, training=True), from_logits=True
                    )
                )
            for var, grad in zip(weights, tape.gradient(loss, weights)):
                var.assign_sub(lr * grad)  # plain SGD, applied on the PS as each step lands
            return loss

        return strategy.run(replica_fn, args=next(it))

    return step_fn


def write_mnist_rows(path: Path, train_size: int, seed: int = 0) -> Path:
    """Write label + 784 pixels per row as raw uint8, for a dataset_fn to read with TF ops."""
    from helpers.data.mnist import load_mnist

    (x, y), _ = load_mnist()
    order = np.random.default_rng(seed).permutation(len(x))[:train_size]
    rows = np.concatenate([y[order, None].astype(np.uint8), x[order].reshape(-1, 784)], axis=1)
    with files.atomic_path(path) as tmp:  # never a half-written file
        rows.tofile(tmp)
    return Path(path)


def run_server() -> None:
    """Serve this task's part of the cluster (a PS or a PS-strategy worker) until killed."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol="grpc",
        start=True,
    )
    print(event_line(Event.READY), end="", flush=True)
    server.join()


def main(argv: list[str]) -> None:
    """`python -m helpers.cluster.strategies job.json [--parent-pid PID | --remote]`: run the
    job in the role TF_CONFIG gives this process. --parent-pid: this task is SIGKILLed when
    the launcher dies (TF catches SIGTERM); --remote, on another host: stdin is its lifeline
    and it answers the launcher's pings (helpers.system.remote.remote_lifeline)."""
    lean_keras_import()
    say = event_writer(sys.stdout)  # the main thread and the lifeline's reader both say
    if "--parent-pid" in argv:
        die_with_parent(int(argv[argv.index("--parent-pid") + 1]), signal.SIGKILL)
    elif "--remote" in argv:
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        remote_lifeline(f"{task['type']}:{task['index']}", say)
    job = validate(json.loads(Path(argv[0]).read_text()))
    if job["kind"] == "server":
        run_server()
        return
    result = run_mwms(job) if job["kind"] == "mwms" else run_ps(job)
    say(Event.DONE, result=result)


if __name__ == "__main__":
    main(sys.argv[1:])
