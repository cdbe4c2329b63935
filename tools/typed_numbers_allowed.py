"""Numbers typed into prose that are neither a setting nor a reference, each with its reason:
facts of a dataset, a model or a number format, definitions, and the givens of an exercise.
None is a measured result of a run. tools/typed_numbers.py finds the rest; an entry that no
longer matches anything fails tests/test_typed_numbers.py, so the list cannot go stale."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Allowed:
    path: str  # the file, from the project's root
    number: str  # as typed
    phrase: str  # a piece of its sentence, so that the same number elsewhere is not allowed
    reason: str

    def matches(self, typed) -> bool:
        return (
            typed.where.split(" cell ")[0].split(":")[0] == self.path
            and typed.number == self.number
            and self.phrase in typed.context
        )


NB = "notebooks/"
ALLOWED = [
    # facts of the datasets
    Allowed(
        NB + "01_doc2vec_dbpedia.ipynb",
        "174",
        "174 MB",
        "DBpedia-14's train.csv is 174,148,970 bytes (its SOURCES.md)",
    ),
    Allowed(NB + "02_logreg_lr_schedules.ipynb", "14", "out of 14", "DBpedia-14 has 14 classes"),
    Allowed(
        NB + "07_fault_tolerance.ipynb",
        "0.1",
        "chance is 0.1",
        "chance on MNIST's 10 balanced classes",
    ),
    Allowed(NB + "09_past_the_laptop.ipynb", "60,000", "all 60,000", "MNIST's training set size"),
    Allowed("helpers/data/arrays.py", "784", "vectors of 784", "MNIST's image shape"),
    Allowed("helpers/data/arrays.py", "28", "28 x 28", "MNIST's image shape"),
    Allowed("helpers/data/mnist.py", "28", "28, 28", "MNIST's image shape"),
    Allowed(
        "helpers/data/downloads.py",
        "68",
        "68 MB archive",
        "dbpedia_csv.tar.gz's size (its SOURCES.md)",
    ),
    # facts of a model, a format or a piece of mathematics
    Allowed(
        NB + "04_multi_device_mnist.ipynb",
        "61",
        "61.7k parameters",
        "LeNet's 61,706 parameters (helpers/training/models.py; notebook 08 asserts 4 bytes each)",
    ),
    Allowed(
        NB + "05_parameter_server.ipynb",
        "31",
        "31 kB",
        "logistic regression on MNIST: (784 x 10 + 10) float32 = 31,400 bytes",
    ),
    Allowed(
        "helpers/training/models.py",
        "1.86",
        "1.86 M parameters",
        "784x1024 + 1024x1024 + 1024x10 weights and their biases: 1,863,690",
    ),
    Allowed("helpers/training/models.py", "7.5", "7.5 MB", "1,863,690 float32 parameters"),
    Allowed("helpers/cluster/wire.py", "8", "8 + 1", "LeNet has 8 variables"),
    Allowed("helpers/cluster/runlogs.py", "32", "32-byte header", "the wire format's header"),
    Allowed(
        "helpers/training/compression.py",
        "3",
        "3 significant digits",
        "float16's 11-bit significand: log10(2^11) = 3.3 decimal digits",
    ),
    Allowed("helpers/compare.py", "9", "9 pairwise ratios", "3 repeats x 3 repeats"),
    Allowed(
        "helpers/compare.py",
        "5",
        "5 pairs that all agree",
        "an exact Wilcoxon test's smallest two-sided p-value with 5 pairs is 1/16",
    ),
    Allowed(
        NB + "09_past_the_laptop.ipynb",
        "0.58",
        "ln N + 0.58",
        "the Euler-Mascheroni constant, 0.5772",
    ),
    # definitions
    Allowed("helpers/cluster/runlogs.py", "100", "100 = one core", "the unit of CPU%"),
    Allowed("helpers/system/resources.py", "100", "100 = one full core", "the unit of CPU%"),
    # the givens and requirements of an exercise
    Allowed(
        NB + "06_stragglers_and_backup_workers.ipynb",
        "1e-4",
        "to within 1e-4",
        "exercise 2's required precision",
    ),
    Allowed(
        NB + "08_multi_worker_strategies.ipynb", "50", "α = 50 µs", "exercise 1's given latency"
    ),
    Allowed(NB + "09_past_the_laptop.ipynb", "199", "seeds 0 to 199", "exercise 2's given seeds"),
    # what a setting elsewhere is, and targets a benchmark checks
    Allowed(
        "helpers/sim/calibrate.py",
        "0.5",
        "every 0.5 s",
        "the launcher samples CPU with interval=0.5 (helpers/cluster/launcher.py)",
    ),
    Allowed(
        "helpers/cluster/kube.py",
        "700",
        "700 MB",
        "a TF process's memory, why the pods request 2Gi (the brief; helpers.doctor measures it)",
    ),
    Allowed(
        "helpers/sim/simulator.py",
        "1,000",
        "1,000",
        "the target bench/sim_speed.py measures (--workers 1000 --updates 1000)",
    ),
]


def unaccounted(found, allowed=ALLOWED) -> list:
    """The typed numbers no allow-list entry covers."""
    return [t for t in found if not any(a.matches(t) for a in allowed)]


def unused(found, allowed=ALLOWED) -> list[Allowed]:
    """The allow-list entries that match nothing any more."""
    return [a for a in allowed if not any(a.matches(t) for t in found)]
