"""The sweep cache: each finished run is stored once, re-runs skip it, failures leave nothing."""

import json

import pytest

from helpers.training import sweeps


@pytest.fixture(autouse=True)
def runs_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_RUNS_DIR", str(tmp_path))
    return tmp_path


def test_rerun_skips_cached_runs_and_runs_only_new_ones(runs_in_tmp):
    calls = []

    def run(cfg):
        calls.append(cfg)
        return {"score": cfg["lr"] * 2}

    grid = [{"opt": "sgd", "lr": lr} for lr in (0.1, 0.01)]
    first = sweeps.run_sweep("demo", grid, run)
    assert [r["cached"] for r in first] == [False, False]
    assert len(list((runs_in_tmp / "sweeps" / "demo").glob("*.json"))) == 2
    second = sweeps.run_sweep("demo", grid + [{"opt": "sgd", "lr": 1.0}], run)
    assert [r["cached"] for r in second] == [True, True, False]
    assert len(calls) == 3
    assert [r["result"]["score"] for r in second] == [0.2, 0.02, 2.0]


def test_key_ignores_dict_order_but_not_values():
    assert sweeps.config_key({"a": 1, "b": 2}) == sweeps.config_key({"b": 2, "a": 1})
    assert sweeps.config_key({"a": 1}) != sweeps.config_key({"a": 2})


def test_failed_run_leaves_no_file_and_runs_again(runs_in_tmp):
    def boom(cfg):
        raise RuntimeError("training crashed")

    with pytest.raises(RuntimeError):
        sweeps.run_sweep("crash", [{"lr": 1}], boom)
    assert list((runs_in_tmp / "sweeps" / "crash").iterdir()) == []
    out = sweeps.run_sweep("crash", [{"lr": 1}], lambda cfg: {"ok": True})
    assert out[0]["cached"] is False


def test_unserialisable_result_leaves_no_partial_file(runs_in_tmp):
    with pytest.raises(TypeError):
        sweeps.run_sweep("bad", [{"lr": 1}], lambda cfg: {"x": object()})
    assert list((runs_in_tmp / "sweeps" / "bad").iterdir()) == []


def test_cache_file_holds_config_and_result(runs_in_tmp):
    sweeps.run_sweep("show", [{"lr": 0.5}], lambda cfg: {"acc": 0.9})
    (path,) = (runs_in_tmp / "sweeps" / "show").glob("*.json")
    assert json.loads(path.read_text()) == {"config": {"lr": 0.5}, "result": {"acc": 0.9}}
    assert path.stem == sweeps.config_key({"lr": 0.5})
    assert sweeps.clear_sweep("show") == 1


def test_bad_configs_and_names_are_refused_before_any_run():
    calls = []
    with pytest.raises(ValueError, match="sweep config must be plain JSON"):
        sweeps.run_sweep("x", [{"lr": 1}, {"lr": object()}], lambda c: calls.append(c) or {})
    assert calls == []
    with pytest.raises(ValueError, match="sweep name must be a plain folder name, got '../x'"):
        sweeps.run_sweep("../x", [], lambda c: {})
