"""One update of the PS's parameters, as the PS applies it (sync, SSP, backup) and as an async
worker applies its own gradient on the PS, inside its step function (worker.py)."""

from __future__ import annotations


def apply_update(
    var_handles,
    version_handle,
    grads_list,
    weights,
    lr,
    momentum=0.0,
    velocity_handles=(),
    devices=None,
):
    """One update: SGD (or momentum) with the weighted sum of the pushed gradients.

    var <- var - lr * sum_j weights[j] * grads_list[j] (with momentum m: v <- m v + g,
    var <- var - lr v), then version += 1, once the variables are written. Raw ops, so the PS
    runs it eagerly, with no tf.function call per update, and an async worker inside its step
    function on the PS's device, where `lr` is a tensor. `devices`, when given, names the
    device of each variable (the PS task holding that piece, sharded runs): its sum and write
    run there. Returns the version increment (an op, in a tf.function).
    """
    import tensorflow as tf

    raw = tf.raw_ops
    writes = []
    lr = tf.cast(lr, tf.float32)
    for i, h in enumerate(var_handles):
        with tf.device(devices[i] if devices else None):
            if weights == [1.0]:
                g = grads_list[0][i]
            else:
                g = tf.add_n([w * grads[i] for w, grads in zip(weights, grads_list)])
            writes.append(_write(h, g, lr, momentum, velocity_handles[i] if momentum else None))
    with tf.control_dependencies(writes):  # ops on other resources are not ordered otherwise
        return raw.AssignAddVariableOp(resource=version_handle, value=tf.constant(1, tf.int64))


def _write(handle, grad, lr, momentum, velocity):
    """var <- var - lr * grad (plain SGD), or with momentum through `velocity`."""
    import tensorflow as tf

    raw = tf.raw_ops
    if momentum:
        return raw.ResourceApplyMomentum(
            var=handle, accum=velocity, lr=lr, grad=grad, momentum=tf.constant(momentum, tf.float32)
        )
    return raw.ResourceApplyGradientDescent(var=handle, alpha=lr, delta=grad)


def staged_apply(res, comp, momentum):
    """Sharded runs (P > 1): the function PS task 0 calls to apply one update on every task.

    `fn(keys, weights, lr)` takes the pushes' keys (wire.push_key) and their weights; on each
    PS task, in parallel, it takes those pushes' pieces out of the task's `stage` buffer,
    decodes them, sums them with their weights and applies the sum to the task's pieces. A
    weight of 0 only removes a push (a dropped one, or a warm-up's). It does not count the
    update: task 0 increments `version` once the call has returned (every piece written).
    The loop over keys is unrolled, not a tf.while_loop, so each number of keys is traced
    once (`warm_staged` does it before the run).
    """
    import tensorflow as tf

    raw = tf.raw_ops

    @tf.function
    def fn(keys, weights, lr):
        writes = []
        for task, idx in enumerate(res.task_pieces()):
            if not idx:
                continue
            shapes = [res.pieces[i].shape for i in idx]
            dtypes = res.stage_dtypes(task)
            with tf.device(res.devices[task]):
                summed = [tf.zeros(s) for s in shapes]
                for n in range(keys.shape[0]):
                    staged = raw.MapUnstage(
                        key=keys[n],
                        indices=list(range(len(dtypes))),
                        dtypes=dtypes,
                        shared_name=res.stage,
                    )
                    grads = comp.decode(staged, shapes)
                    summed = [
                        a + weights[n] * tf.reshape(g, a.shape) for a, g in zip(summed, grads)
                    ]
                for i, g in zip(idx, summed):
                    writes.append(
                        _write(res.vars[i], g, lr, momentum, res.velocity[i] if momentum else None)
                    )
        with tf.control_dependencies(writes):
            return tf.constant(0)

    return fn


def warm_staged(fn, res, counts) -> None:
    """Trace and run `fn` (staged_apply's) once for each number of keys in `counts`, on
    zero pushes staged under negative keys (no worker's), with weight 0 and learning rate 0:
    the parameters do not change, and no update of the run pays for tracing."""
    import tensorflow as tf

    raw = tf.raw_ops
    for n in sorted(set(counts)):
        keys = tf.constant([-1 - i for i in range(n)], tf.int64)
        for task, spec in enumerate(res.task_push_spec):
            if not spec:
                continue
            with tf.device(res.devices[task]):
                for key in keys:
                    raw.MapStage(
                        key=key,
                        indices=list(range(len(spec))),
                        values=[tf.zeros(s, d) for d, s in spec],
                        dtypes=res.stage_dtypes(task),
                        shared_name=res.stage,
                    )
        fn(keys, tf.zeros([n]), tf.constant(0.0))
