"""Batch schedules and index plans."""

import numpy as np
import pytest

from helpers.training.batches import batch_size_at, epoch_batches


def test_growing_schedules_follow_their_formula():
    assert [batch_size_at("30+10e", e) for e in range(3)] == [30, 40, 50]
    assert [batch_size_at("500+50e", e) for e in range(2)] == [500, 550]
    assert batch_size_at(64, 7) == 64
    assert batch_size_at((8, 2), 3) == 14


def test_disjoint_batches_partition_the_data():
    batches = epoch_batches(103, 10, seed=1)
    allidx = np.concatenate(batches)
    assert sorted(allidx.tolist()) == list(range(103))
    assert [len(b) for b in batches] == [10] * 10 + [3]


def test_overlapping_batches_share_the_asked_fraction():
    batches = epoch_batches(100, 10, overlap=0.5, seed=2)
    for a, b in zip(batches, batches[1:]):
        assert len(set(a) & set(b)) == 5
    assert set(np.concatenate(batches).tolist()) == set(range(100))
    assert len(batches) == 19


def test_shuffle_depends_on_seed():
    assert not np.array_equal(epoch_batches(50, 50, seed=0)[0], epoch_batches(50, 50, seed=1)[0])


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="overlap must be in \\[0, 1\\), got 1.0"):
        epoch_batches(10, 2, overlap=1.0)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        epoch_batches(10, 0)
    with pytest.raises(ValueError, match="unknown schedule 'fast'"):
        batch_size_at("fast", 0)
    with pytest.raises(ValueError, match="batch size must be >= 1, got -10"):
        batch_size_at((10, -10), 2)
