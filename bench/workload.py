"""The work both cluster benchmarks time: the model sizes, batch, learning rates, and the
one-process baseline they are compared with."""

from __future__ import annotations

from helpers.training import baseline_sgd

TRAIN_SIZE, BATCH = 6000, 64
LR = {"logreg": 0.5, "lenet": 0.05, "mlp": 0.05}


def one_process(model_name: str, steps: int) -> float:
    """Steps/s of plain SGD in this process, no cluster: the baseline."""
    return baseline_sgd.one_process(
        model_name, "mnist", steps, BATCH, LR[model_name], train_size=TRAIN_SIZE, test_size=100
    )["steps_per_s"]
