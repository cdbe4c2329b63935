"""The streaming DBpedia corpus, Doc2Vec training/inference and the features on disk."""

import json

import numpy as np
import pytest
from gensim.models.doc2vec import TaggedDocument

from helpers.data import dbpedia, feature_files
from helpers.system import resources
from helpers.training import doc2vec


@pytest.fixture
def dbpedia_data(shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
    return shared_data / "dbpedia_subset"


def test_tokenize_lowercases_and_drops_punctuation_digits_and_single_letters():
    words = dbpedia.tokenize(" Devgen is a Belgium-based company (founded 1997). It's O.K.")
    assert words == ["devgen", "is", "belgium", "based", "company", "founded", "it"]


def test_sample_lines_draws_the_same_rows_as_load_dbpedia(dbpedia_data):
    lines = dbpedia.sample_lines("train", n_per_class=7, seed=3)
    frame = dbpedia.load_dbpedia("train", n_per_class=7, seed=3)
    assert list(lines) == list(frame.index)
    assert len(dbpedia.sample_lines("test")) == 9193


def test_corpus_streams_the_selected_articles_in_file_order_on_every_pass(dbpedia_data):
    frame = dbpedia.load_dbpedia("test", n_per_class=5, seed=1)
    corpus = dbpedia.DbpediaCorpus("test", frame.index)
    first, second = list(corpus), list(corpus)
    assert first == second and len(corpus) == len(frame) == 70
    assert all(isinstance(d, TaggedDocument) for d in first)
    assert [d.tags for d in first] == [[k] for k in range(70)]
    assert [d.words for d in first] == [dbpedia.tokenize(c) for c in frame.content]
    np.testing.assert_array_equal(corpus.labels(), frame.label.to_numpy())


def test_streaming_pass_needs_a_fraction_of_the_memory_of_a_list(dbpedia_data):
    corpus = dbpedia.DbpediaCorpus("train", dbpedia.sample_lines("train", 150))
    n_docs, streamed = resources.peak_memory_mb(lambda: sum(1 for _ in corpus))
    docs, listed = resources.peak_memory_mb(lambda: list(corpus))
    assert n_docs == len(docs) == 14 * 150
    assert streamed < listed / 10, (streamed, listed)


def test_corpus_refuses_an_empty_selection(dbpedia_data):
    with pytest.raises(ValueError, match="lines selects no document"):
        dbpedia.DbpediaCorpus("train", [])


def test_sample_lines_refuses_a_bad_count(dbpedia_data):
    with pytest.raises(ValueError, match="n_per_class must be a positive integer or None, got 0"):
        dbpedia.sample_lines("train", 0)


@pytest.fixture(scope="module")
def small_model(shared_data):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
        corpus = dbpedia.DbpediaCorpus("train", dbpedia.sample_lines("train", 25, seed=0))
        # 40 epochs: gensim seeds word vectors with Python's hash(), which differs between
        # processes unless PYTHONHASHSEED is set; at 15 epochs the rank-0 share below swung
        # 0.55-0.65 over hash seeds, at 40 it stays 0.775-0.8.
        seconds = []
        model = doc2vec.train_doc2vec(
            corpus,
            dm=0,
            vector_size=24,
            epochs=40,
            seed=0,
            workers=1,
            progress=False,
            epoch_seconds=seconds,
        )
        return corpus, model, list(corpus), seconds


def test_doc2vec_learns_one_vector_per_document(small_model):
    corpus, model, docs, _ = small_model
    assert len(model.dv) == len(corpus) == 350
    assert model.dv.vectors.shape == (350, 24)


def test_each_epoch_is_timed(small_model):
    *_, seconds = small_model
    assert len(seconds) == 40 and all(0 < t < 60 for t in seconds), seconds


def test_inferred_vectors_sit_near_the_trained_ones(small_model):
    corpus, model, docs, _ = small_model
    inferred = doc2vec.infer_vectors(model, docs[:40], progress=False)
    assert inferred.shape == (40, 24) and inferred.dtype == np.float32
    trained = model.dv.vectors[:40]
    cos = (inferred / np.linalg.norm(inferred, axis=1, keepdims=True)) @ (
        trained / np.linalg.norm(trained, axis=1, keepdims=True)
    ).T
    own_rank = (cos > np.diag(cos)[:, None]).sum(axis=1)  # 0 = its own vector is the nearest
    assert np.mean(own_rank == 0) > 0.6, own_rank


def test_epochs_of_each_size_are_timed_in_turn(shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
    corpus = dbpedia.DbpediaCorpus("train", dbpedia.sample_lines("train", 5, seed=0))
    seconds = doc2vec.epoch_seconds_in_turn(corpus, [8, 32], 3, workers=1, min_count=1)
    assert list(seconds) == [8, 32]
    assert all(len(t) == 3 and all(0 < x < 60 for x in t) for t in seconds.values()), seconds
    with pytest.raises(ValueError, match="repeats must be a positive integer, got 0"):
        doc2vec.epoch_seconds_in_turn(corpus, [8], 0)
    with pytest.raises(ValueError, match="each vector size must be a positive integer, got -8"):
        doc2vec.epoch_seconds_in_turn(corpus, [-8], 1)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(dm=2, vector_size=10, epochs=1),
            "dm must be 0 \\(PV-DBOW\\) or 1 \\(PV-DM\\), got 2",
        ),
        (dict(dm=0, vector_size=0, epochs=1), "vector_size must be a positive integer, got 0"),
        (dict(dm=0, vector_size=10, epochs=-1), "epochs must be a positive integer, got -1"),
    ],
)
def test_train_doc2vec_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        doc2vec.train_doc2vec([TaggedDocument(["a", "b"], [0])], progress=False, **kwargs)


def fake_features(n=6, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return {
        s: (rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, 14, n))
        for s in dbpedia.SPLITS
    }


def test_features_round_trip_with_metadata(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_QUICK", "1")
    feats = fake_features()
    folder = feature_files.save_features(feats, {"seed": np.int64(7)}, tmp_path / "f")
    loaded, meta = feature_files.load_features(folder)
    for s in dbpedia.SPLITS:
        np.testing.assert_array_equal(loaded[s][0], feats[s][0])
        np.testing.assert_array_equal(loaded[s][1], feats[s][1])
    assert meta["seed"] == 7 and meta["quick"] is True
    assert json.loads((folder / "metadata.json").read_text())["shapes"]["dev"] == [6, 3]


def test_loading_features_made_in_the_other_mode_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_QUICK", "1")
    folder = feature_files.save_features(fake_features(), {}, tmp_path / "f")
    monkeypatch.setenv("LABS_QUICK", "0")
    with pytest.raises(ValueError, match="made in quick mode but this run is in full.*01_doc2vec"):
        feature_files.load_features(folder)


def test_missing_features_name_notebook_01(tmp_path):
    with pytest.raises(FileNotFoundError, match="run notebooks/01_doc2vec_dbpedia.ipynb first"):
        feature_files.load_features(tmp_path / "nothing")


def test_a_failed_save_leaves_the_previous_features_and_no_debris(tmp_path):
    folder = feature_files.save_features(fake_features(seed=1), {"run": 1}, tmp_path / "f")
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        feature_files.save_features(fake_features(seed=2), {"run": object()}, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    loaded, meta = feature_files.load_features(folder, quick=meta_quick(folder))
    assert meta["run"] == 1
    np.testing.assert_array_equal(loaded["train"][0], fake_features(seed=1)["train"][0])


def meta_quick(folder):
    return json.loads((folder / "metadata.json").read_text())["quick"]


def test_save_refuses_missing_splits_and_ragged_arrays(tmp_path):
    feats = fake_features()
    with pytest.raises(ValueError, match="exactly the splits"):
        feature_files.save_features({"train": feats["train"]}, {}, tmp_path / "f")
    feats["dev"] = (feats["dev"][0], feats["dev"][1][:-1])
    with pytest.raises(ValueError, match="dev: X must be 2-D and y 1-D of the same length"):
        feature_files.save_features(feats, {}, tmp_path / "f")
    assert not (tmp_path / "f").exists()
