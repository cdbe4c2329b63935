"""One update of the PS's parameters, as the PS applies it (sync, SSP, backup) and as an async
worker applies its own gradient on the PS, inside its step function (worker.py)."""
from __future__ import annotations


def apply_update(var_handles, version_handle, grads_list, weights, lr, momentum=0.0,
                 velocity_handles=()):
    """One update: SGD (or momentum) with the weighted sum of the pushed gradients.

    var <- var - lr * sum_j weights[j] * grads_list[j] (with momentum m: v <- m v + g,
    var <- var - lr v), then version += 1, once the variables are written. Raw ops, so the PS
    runs it eagerly (in a process serving a cluster a tf.function call cost ~1.4 ms per update,
    these ops ~0.3 ms), and an async worker inside its step function on the PS's device, where
    `lr` is a tensor. Returns the version increment (an op, in a tf.function).
    """
    import tensorflow as tf

    raw = tf.raw_ops
    if weights == [1.0]:
        grads = grads_list[0]
    else:
        grads = [tf.add_n([w * g[i] for w, g in zip(weights, grads_list)])
                 for i in range(len(grads_list[0]))]
    lr = tf.cast(lr, tf.float32)
    if momentum:
        m = tf.constant(momentum, tf.float32)
        writes = [raw.ResourceApplyMomentum(var=h, accum=v, lr=lr, grad=g, momentum=m)
                  for h, g, v in zip(var_handles, grads, velocity_handles)]
    else:
        writes = [raw.ResourceApplyGradientDescent(var=h, alpha=lr, delta=g)
                  for h, g in zip(var_handles, grads)]
    with tf.control_dependencies(writes):  # ops on other resources are not ordered otherwise
        return raw.AssignAddVariableOp(resource=version_handle, value=tf.constant(1, tf.int64))
