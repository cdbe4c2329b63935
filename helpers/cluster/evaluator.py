"""The evaluator's side of a run: test each checkpoint the PS announces, as it comes."""

from __future__ import annotations

import tensorflow as tf

from helpers.cluster.events import Kind
from helpers.cluster.rundir import Checkpoint, RunDir
from helpers.training import models


class EvaluatorLoop:
    """Evaluate each checkpoint the PS announces; log test accuracy against wall time."""

    def __init__(self, node, run_dir, log, model, res, test):
        self.node, self.run_dir, self.log = node, run_dir, log
        self.model, self.res = model, res
        self.score = models.accuracy_fn(model, *test)

    def run(self) -> dict:
        raw = tf.raw_ops
        evaluated = 0
        while True:
            try:
                with tf.device(self.node.ps_device):
                    version = int(
                        raw.QueueDequeueV2(handle=self.res.ckpt, component_types=[tf.int64])[0]
                    )
            except tf.errors.OutOfRangeError:  # the PS closed the queue: the run failed
                break
            if version < 0:
                break
            ckpt = Checkpoint.of(version)
            values = RunDir(self.run_dir).load_checkpoint(ckpt)
            for var, value in zip(self.model.trainable_variables, values):
                var.assign(value)
            acc = self.score()
            self.log.write(Kind.EVAL, version=version, test_accuracy=acc, file=ckpt.file)
            evaluated += 1
        return {"evaluated": evaluated}
