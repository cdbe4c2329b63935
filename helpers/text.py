"""Stream tokenised DBpedia articles from disk, train Doc2Vec, and save its features."""
from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
from gensim.models.callbacks import CallbackAny2Vec
from gensim.models.doc2vec import Doc2Vec, TaggedDocument
from gensim.utils import simple_preprocess

from helpers import config, data, files

SPLITS = ("train", "dev", "test")


def tokenize(text: str) -> list[str]:
    """Lower-case a text and split it into words of 2..20 letters (gensim simple_preprocess)."""
    return simple_preprocess(text, min_len=2, max_len=20)


def sample_lines(split: str, n_per_class: int | None = None, seed: int = 0) -> np.ndarray:
    """CSV line numbers of a stratified sample of a split (all lines when n_per_class is None).

    Streams only the labels, as `data.load_dbpedia` would draw them.
    """
    data.check_n_per_class(n_per_class)  # before the file is read
    rows = [(r.line, r.label) for r in data.iter_dbpedia(split)]
    lines = np.array([line for line, _ in rows], dtype=np.int64)
    if n_per_class is None:
        return lines
    labels = np.array([label for _, label in rows], dtype=np.int64)
    return lines[data.stratified_sample(labels, n_per_class, seed)]


class DbpediaCorpus:
    """Tokenised articles of one split, re-read from the CSV on every pass.

    Each pass yields TaggedDocument(words, [k]) with k = 0, 1, ... in file order, so a
    Doc2Vec model's `dv[k]` is the k-th document. Only the line numbers to keep are held
    in memory, never the text.

    Args:
        split: "train" or "test".
        lines: CSV line numbers to keep (e.g. from `sample_lines`); None keeps all.
    """

    def __init__(self, split: str, lines=None):
        self.split = split
        self.lines = None if lines is None else np.unique(np.asarray(lines, dtype=np.int64))
        if self.lines is not None and len(self.lines) == 0:
            raise ValueError(f"lines selects no document of {split!r}: pass None or a non-empty list")
        self._len = None if self.lines is None else len(self.lines)

    def rows(self):
        """Yield the selected DbpediaRow tuples, streaming the file."""
        wanted = None if self.lines is None else set(self.lines.tolist())
        for row in data.iter_dbpedia(self.split):
            if wanted is None or row.line in wanted:
                yield row

    def __iter__(self):
        for k, row in enumerate(self.rows()):
            yield TaggedDocument(tokenize(row.content), [k])

    def __len__(self):
        if self._len is None:
            self._len = sum(1 for _ in self.rows())
        return self._len

    def labels(self) -> np.ndarray:
        """The labels 0..13 of the selected documents, in corpus order."""
        return np.fromiter((r.label for r in self.rows()), dtype=np.int64)

    def __repr__(self):
        return f"DbpediaCorpus({self.split!r}, {len(self)} documents)"


def peak_memory_mb(fn) -> tuple[object, float]:
    """Run fn() under tracemalloc; return (its result, peak Python allocation in MB)."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak / 2**20


class _EpochBar(CallbackAny2Vec):
    """Advance a tqdm bar once per epoch and show the training speed in words/s."""

    def __init__(self, bar, words_per_epoch: int):
        self.bar, self.words, self.t0 = bar, words_per_epoch, None

    def on_epoch_begin(self, model):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, model):
        rate = self.words / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"{rate / 1e3:,.0f}k words/s")
        self.bar.update(1)


def train_doc2vec(corpus, *, dm: int, vector_size: int, epochs: int, seed: int = 0,
                  workers: int = 2, progress: bool = True, **kwargs) -> Doc2Vec:
    """Build the vocabulary and train a Doc2Vec model with a tqdm bar over epochs.

    Args:
        corpus: a re-iterable of TaggedDocument (e.g. DbpediaCorpus).
        dm: 1 for PV-DM (predict a word from context + document), 0 for PV-DBOW.
        vector_size: dimension of the document vectors.
        epochs: passes over the corpus.
        seed: seed of the model's initialisation (exact repeats also need workers=1).
        workers: training threads.
        progress: show the tqdm bar.
        **kwargs: passed on to gensim's Doc2Vec (window, min_count, dbow_words, ...).
    Returns:
        The trained gensim Doc2Vec model.
    """
    from tqdm.auto import tqdm

    for name, value in (("vector_size", vector_size), ("epochs", epochs), ("workers", workers)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if dm not in (0, 1):
        raise ValueError(f"dm must be 0 (PV-DBOW) or 1 (PV-DM), got {dm!r}")
    model = Doc2Vec(dm=dm, vector_size=vector_size, epochs=epochs, seed=seed,
                    workers=workers, **kwargs)
    model.build_vocab(corpus)
    name = "PV-DM" if dm else "PV-DBOW"
    with tqdm(total=epochs, desc=f"{name} {vector_size}d", unit="epoch",
              disable=not progress) as bar:
        model.train(corpus, total_examples=model.corpus_count, epochs=epochs,
                    callbacks=[_EpochBar(bar, model.corpus_total_words)])
    return model


def infer_vectors(model: Doc2Vec, corpus, epochs: int | None = None,
                  progress: bool = True) -> np.ndarray:
    """Infer one vector per document of `corpus` (streamed), as a float32 array."""
    from tqdm.auto import tqdm

    vectors = [model.infer_vector(doc.words, epochs=epochs)
               for doc in tqdm(corpus, total=len(corpus), desc="infer", unit="doc",
                               disable=not progress, leave=False)]
    return np.asarray(vectors, dtype=np.float32).reshape(len(vectors), model.vector_size)


# --------------------------------------------------------------------------- features on disk

def features_dir() -> Path:
    """Where notebook 01 saves the Doc2Vec features: runs/features/doc2vec_dbpedia."""
    return config.runs_dir("features") / "doc2vec_dbpedia"


def save_features(features: dict, metadata: dict, directory: Path | None = None) -> Path:
    """Write {split: (X, y)} as .npy files plus metadata.json, all or nothing.

    The files go to a temporary folder that replaces `directory` only once complete.
    """
    directory = Path(directory) if directory is not None else features_dir()
    if set(features) != set(SPLITS):
        raise ValueError(f"features must have exactly the splits {SPLITS}, got {sorted(features)}")
    for split, (x, y) in features.items():
        if np.ndim(x) != 2 or np.ndim(y) != 1 or len(x) != len(y):
            raise ValueError(f"{split}: X must be 2-D and y 1-D of the same length, "
                             f"got shapes {np.shape(x)} and {np.shape(y)}")
    with files.atomic_path(directory, directory=True) as tmp:
        for split, (x, y) in features.items():
            np.save(tmp / f"{split}_X.npy", np.asarray(x, dtype=np.float32))
            np.save(tmp / f"{split}_y.npy", np.asarray(y, dtype=np.int64))
        meta = dict(metadata, quick=config.is_quick(),
                    shapes={s: list(np.shape(x)) for s, (x, _) in features.items()})
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2, default=_jsonable))
    return directory


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"metadata value {value!r} is not JSON-serialisable")


def load_features(directory: Path | None = None, quick: bool | None = None):
    """Load the features notebook 01 saved.

    Args:
        directory: the folder save_features wrote (default: features_dir()).
        quick: the mode the features must have been made in (default: this run's mode).
    Returns:
        ({split: (X, y)}, metadata dict).
    Raises:
        FileNotFoundError: nothing saved yet (run notebook 01 first).
        ValueError: the features were made in the other mode.
    """
    directory = Path(directory) if directory is not None else features_dir()
    quick = config.is_quick() if quick is None else quick
    mode = "quick (LABS_QUICK=1)" if quick else "full (LABS_QUICK unset)"
    meta_path = directory / "metadata.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no Doc2Vec features in {directory}: run notebooks/01_doc2vec_dbpedia.ipynb "
            f"first, in {mode} mode, to create them")
    meta = json.loads(meta_path.read_text())
    if bool(meta.get("quick")) != quick:
        made = "quick" if meta.get("quick") else "full"
        raise ValueError(
            f"the features in {directory} were made in {made} mode but this run is in {mode} "
            f"mode: re-run notebooks/01_doc2vec_dbpedia.ipynb in {mode} mode")
    out = {}
    for split in SPLITS:
        x, y = np.load(directory / f"{split}_X.npy"), np.load(directory / f"{split}_y.npy")
        if list(x.shape) != meta["shapes"][split] or len(y) != len(x):
            raise ValueError(
                f"{directory}/{split}_X.npy has shape {x.shape}, metadata says "
                f"{meta['shapes'][split]}: re-run notebooks/01_doc2vec_dbpedia.ipynb")
        out[split] = (x, y)
    return out, meta
