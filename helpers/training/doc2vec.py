"""Train Doc2Vec on a streamed corpus (helpers.data.dbpedia) with a progress bar; infer vectors."""

from __future__ import annotations

import time

import numpy as np
from gensim.models.callbacks import CallbackAny2Vec
from gensim.models.doc2vec import Doc2Vec


class _EpochBar(CallbackAny2Vec):
    """Advance a tqdm bar once per epoch, show the training speed in words/s, and append each
    epoch's wall-clock seconds to `seconds`."""

    def __init__(self, bar, words_per_epoch: int, seconds: list):
        self.bar, self.words, self.t0, self.seconds = bar, words_per_epoch, None, seconds

    def on_epoch_begin(self, model):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, model):
        elapsed = time.perf_counter() - self.t0
        self.seconds.append(elapsed)
        rate = self.words / max(elapsed, 1e-9)
        self.bar.set_postfix_str(f"{rate / 1e3:,.0f}k words/s")
        self.bar.update(1)


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def train_doc2vec(
    corpus,
    *,
    dm: int,
    vector_size: int,
    epochs: int,
    seed: int = 0,
    workers: int = 2,
    progress: bool = True,
    epoch_seconds: list | None = None,
    **kwargs,
) -> Doc2Vec:
    """Build the vocabulary and train a Doc2Vec model with a tqdm bar over epochs.

    Args:
        corpus: a re-iterable of TaggedDocument (e.g. DbpediaCorpus).
        dm: 1 for PV-DM (predict a word from context + document), 0 for PV-DBOW.
        vector_size: dimension of the document vectors.
        epochs: passes over the corpus.
        seed: seed of the model's initialisation (exact repeats also need workers=1).
        workers: training threads.
        progress: show the tqdm bar.
        epoch_seconds: a list to which each epoch's wall-clock seconds are appended: one
            repeated measurement per epoch, of the same work.
        **kwargs: passed on to gensim's Doc2Vec (window, min_count, dbow_words, ...).
    Returns:
        The trained gensim Doc2Vec model.
    """
    from tqdm.auto import tqdm

    for name, value in (("vector_size", vector_size), ("epochs", epochs), ("workers", workers)):
        _check_positive_int(name, value)
    if dm not in (0, 1):
        raise ValueError(f"dm must be 0 (PV-DBOW) or 1 (PV-DM), got {dm!r}")
    model = Doc2Vec(
        dm=dm, vector_size=vector_size, epochs=epochs, seed=seed, workers=workers, **kwargs
    )
    model.build_vocab(corpus)
    name = "PV-DM" if dm else "PV-DBOW"
    with tqdm(
        total=epochs, desc=f"{name} {vector_size}d", unit="epoch", disable=not progress
    ) as bar:
        model.train(
            corpus,
            total_examples=model.corpus_count,
            epochs=epochs,
            callbacks=[
                _EpochBar(
                    bar, model.corpus_total_words, [] if epoch_seconds is None else epoch_seconds
                )
            ],
        )
    return model


def epoch_seconds_in_turn(
    corpus, sizes, repeats: int, *, dm: int = 0, seed: int = 0, workers: int = 2, **kwargs
) -> dict:
    """One epoch of a model of each vector size in turn, `repeats` rounds: {size: [seconds]}.

    On a shared machine, models timed one after the other meet different loads, and a change
    of load reads as a difference between them; taking turns spreads it over every size, so
    the times compare like for like. Each model builds its vocabulary once (not timed), then
    trains one epoch per round, continuing where its last round stopped."""
    _check_positive_int("repeats", repeats)
    for size in sizes:
        _check_positive_int("each vector size", size)
    models = {
        size: Doc2Vec(dm=dm, vector_size=size, seed=seed, workers=workers, **kwargs)
        for size in sizes
    }
    for model in models.values():
        model.build_vocab(corpus)
    seconds: dict = {size: [] for size in models}
    for _ in range(repeats):
        for size, model in models.items():
            t0 = time.perf_counter()
            model.train(corpus, total_examples=model.corpus_count, epochs=1)
            seconds[size].append(time.perf_counter() - t0)
    return seconds


def infer_vectors(
    model: Doc2Vec, corpus, epochs: int | None = None, progress: bool = True
) -> np.ndarray:
    """Infer one vector per document of `corpus` (streamed), as a float32 array."""
    from tqdm.auto import tqdm

    vectors = [
        model.infer_vector(doc.words, epochs=epochs)
        for doc in tqdm(
            corpus, total=len(corpus), desc="infer", unit="doc", disable=not progress, leave=False
        )
    ]
    return np.asarray(vectors, dtype=np.float32).reshape(len(vectors), model.vector_size)


# --------------------------------------------------------------------------- features on disk
