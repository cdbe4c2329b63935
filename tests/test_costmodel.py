"""The cost model of notebook 05's sharding section: fitted from exact points it recovers its
parameters, and its throughput is the smaller of the workers' pace and the busiest PS task's."""

import math

import pytest

from helpers.cluster import costmodel, wire
from helpers.training import compression

MLP = [(784, 1024), (1024,), (1024, 1024), (1024,), (1024, 10), (10,)]


def test_fit_recovers_the_parameters_of_exact_points():
    alpha, beta, phi, gamma, delta = 1e-3, 1.5e9, 1.5e-3, 4.5e-10, 1e-3
    messages = [(b, alpha + b / beta) for b in (3e4, 2.5e5, 7.5e6)]
    one_task = [(b, phi + gamma * b) for b in (6e4, 5e5, 1.5e7)]
    split = [(b, phi + gamma * b + delta) for b in (7.4e6, 7.5e6)]
    cm = costmodel.CostModel.fit(messages, one_task, 4e-3, split)
    assert cm.alpha_s == pytest.approx(alpha) and cm.beta == pytest.approx(beta)
    assert cm.phi_s == pytest.approx(phi) and cm.gamma_s == pytest.approx(gamma)
    assert cm.delta_s == pytest.approx(delta) and cm.compute_s == 4e-3


def test_throughput_is_the_smaller_of_workers_and_the_busiest_task():
    cm = costmodel.CostModel(
        alpha_s=1e-3, beta=1e9, compute_s=4e-3, phi_s=2e-3, gamma_s=5e-10, delta_s=1e-3
    )
    model = 7.5e6
    step = 4e-3 + 2 * (1e-3 + 7.5e-3)  # one task: compute, pull and push of the whole model
    assert cm.step_s(model, 1) == pytest.approx(step)
    assert cm.step_s(model, 2) == pytest.approx(step + 2e-3)  # one more message each way
    one = [2 * model]
    busy = 2e-3 + 5e-10 * 2 * model
    assert cm.ps_busy_s(one) == [pytest.approx(busy)]
    assert cm.throughput(1, model, one) == pytest.approx(1 / step)  # the worker is the limit
    assert cm.throughput(50, model, one) == pytest.approx(1 / busy)  # the PS is
    assert cm.saturation(model, one) == pytest.approx(step / busy)
    two = [model, model]  # halves: each task busier by delta, but carries half
    assert cm.ps_busy_s(two) == [pytest.approx(2e-3 + 5e-10 * model + 1e-3)] * 2
    assert cm.throughput(50, model, two) > cm.throughput(50, model, one)


def test_a_fit_without_a_cost_per_byte_is_refused():
    with pytest.raises(ValueError, match="the fit found no cost per byte"):
        costmodel.CostModel.fit([(1e3, 2e-3), (1e6, 1e-3)], [(1e3, 1e-3), (1e6, 2e-3)], 1e-3)


@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_task_bytes_split_the_model_and_its_pushes(tasks):
    per_task = costmodel.task_bytes(MLP, tasks)
    params = 4 * sum(math.prod(s) for s in MLP)
    assert sum(t["pull"] for t in per_task) == params
    assert sum(t["push"] for t in per_task) == params + 32  # the header goes to task 0
    assert per_task[0]["push"] - per_task[0]["pull"] == 32
    f16 = costmodel.task_bytes(MLP, tasks, "float16")
    pieces = wire.plan(MLP, tasks)
    assert (
        sum(t["push"] for t in f16)
        == compression.Float16().bytes_for([p.shape for p in pieces]) + 32
    )
