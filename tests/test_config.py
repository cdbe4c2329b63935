import numpy as np
import pytest

from helpers import config


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        (" on ", True),
        ("0", False),
        ("", False),
        ("False", False),
        ("off", False),
    ],
)
def test_env_flag_parses_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("LABS_QUICK", raw)
    assert config.is_quick() is expected


def test_env_flag_rejects_other_values_naming_them(monkeypatch):
    monkeypatch.setenv("LABS_QUICK", "maybe")
    with pytest.raises(ValueError, match=r"LABS_QUICK .*got 'maybe'"):
        config.is_quick()


def test_unset_flag_means_full_mode(monkeypatch):
    monkeypatch.delenv("LABS_QUICK", raising=False)
    assert config.is_quick() is False
    assert config.scale(full=100, quick=5) == 100


def test_scale_picks_quick_value_in_quick_mode(monkeypatch):
    monkeypatch.setenv("LABS_QUICK", "1")
    assert config.scale(full=100, quick=5) == 5
    assert config.scale(full=[1, 2, 3]) == [1, 2, 3]  # no quick value: the full one


def test_paths_default_to_repo_and_follow_env(monkeypatch, tmp_path):
    monkeypatch.delenv("LABS_DATA_DIR", raising=False)
    monkeypatch.delenv("LABS_RUNS_DIR", raising=False)
    assert config.data_dir() == config.REPO_ROOT / "data"
    assert config.runs_dir(create=False) == config.REPO_ROOT / "runs"
    monkeypatch.setenv("LABS_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LABS_RUNS_DIR", str(tmp_path / "runs"))
    assert config.data_dir() == tmp_path / "cache"
    made = config.runs_dir("features", "x")
    assert made == tmp_path / "runs" / "features" / "x" and made.is_dir()


def test_set_seed_makes_python_numpy_and_tf_repeatable():
    import random

    import tensorflow as tf

    def draw():
        return random.random(), np.random.rand(), float(tf.random.uniform(()))

    config.set_seed(7)
    first = draw()
    config.set_seed(7)
    assert draw() == first
    config.set_seed(8)
    assert draw() != first


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_set_seed_rejects_bad_seeds(bad):
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        config.set_seed(bad)


def test_pick_device_names_the_device_and_why(capsys):
    import tensorflow as tf

    device = config.pick_device()
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    assert device == ("/GPU:0" if has_gpu else "/CPU:0")
    assert device in capsys.readouterr().out
