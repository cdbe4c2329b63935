"""Pure-Python rules of parameter-server training: who may step, which gradients count, how much.

Nothing here imports TensorFlow, so every rule is unit-tested on its own and the processes
(ps.py, worker.py) only move tensors around according to these rules.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from helpers.training import compression  # plain Python checks; TF only to compress
from helpers.training.models import MODELS  # numpy only: TF is imported when a model is built

MODES = ("async", "sync", "ssp", "backup")
STALE_POLICIES = ("drop", "fold")
STRAGGLER_DISTS = ("exponential", "uniform")
FAULT_KINDS = ("kill", "hang")


# ---------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------
def ssp_may_step(clock: int, live_clocks: list[int], staleness: int) -> bool:
    """Return True when a worker at `clock` may start a step: clock - min(live clocks) <= s."""
    if not live_clocks:
        return True
    return clock - min(live_clocks) <= staleness


def ssp_grants(granted: int, live_clocks: list[int], staleness: int) -> int:
    """Return how many more step tokens a worker that already holds `granted` may get now."""
    # the worker may start step c (0-based; its clock is c) while c - min <= s
    limit = (min(live_clocks) if live_clocks else granted) + staleness + 1
    return max(0, limit - granted)


WAITING_MODES = ("sync", "backup", "ssp")  # a worker needs a token from the PS for every step


def straggler_delay(spec, compute_s: float, rng) -> float:
    """A straggler's extra sleep after one step: a slowdown factor stretches the step's compute
    time; {"dist": "exponential"|"uniform", "mean": s} draws a delay from `rng` (NumPy)."""
    if spec is None:
        return 0.0
    if isinstance(spec, dict):
        if spec["dist"] == "exponential":
            return float(rng.exponential(spec["mean"]))
        return float(rng.uniform(0, 2 * spec["mean"]))
    return (spec - 1) * compute_s


def batches(rng, n: int, size: int):
    """A worker's batches: indices into its n examples, `size` at a time, from a new
    permutation drawn from `rng` each pass (the engine's worker and the simulator's numerics)."""
    order, pos = rng.permutation(n), 0
    while True:
        if pos + size > n:
            order, pos = rng.permutation(n), 0
        yield order[pos : pos + size]
        pos += size


class SSPGate:
    """SSP's step tokens for a set of workers, kept incrementally: ssp_grants' rule, with the
    slowest live clock tracked as clocks advance (each by one) instead of a min over all
    workers at every push, so a push costs O(1) amortised however many workers there are.

    `start`, `pushed` and `remove` return the tokens to hand out now, as (worker, clock of
    the step it may start, slowest live clock) triples. The PS (ps.py) and the simulator
    (helpers.sim) both follow it.
    """

    def __init__(self, workers, staleness: int):
        self.staleness = staleness
        self.clock = {w: 0 for w in workers}  # pushes applied, per live worker
        self.granted = {w: 0 for w in workers}  # tokens handed out, per worker
        self._at: dict[int, int] = {0: len(self.clock)} if self.clock else {}  # clock -> workers
        self.slowest = 0

    def _grant(self, w) -> list[tuple[int, int, int]]:
        more = ssp_grants(self.granted[w], [self.slowest], self.staleness)
        out = [(w, self.granted[w] + i, self.slowest) for i in range(more)]
        self.granted[w] += more
        return out

    def _all(self) -> list[tuple[int, int, int]]:
        return [g for w in self.clock for g in self._grant(w)]

    def _leave(self, c: int) -> bool:
        """One worker leaves clock c; True when the slowest clock rose."""
        self._at[c] -= 1
        if self._at[c]:
            return False
        del self._at[c]
        if c != self.slowest or not self._at:
            return False
        while self.slowest not in self._at:  # clocks are consecutive-ish: amortised O(1)
            self.slowest += 1
        return True

    def start(self) -> list[tuple[int, int, int]]:
        """Every worker's first tokens (up to staleness + 1 each)."""
        return self._all()

    def pushed(self, w) -> list[tuple[int, int, int]]:
        """Worker w's push was applied: its clock advances; return the tokens it frees."""
        c = self.clock[w]
        self.clock[w] = c + 1
        self._at[c + 1] = self._at.get(c + 1, 0) + 1
        return self._all() if self._leave(c) else self._grant(w)

    def remove(self, w) -> list[tuple[int, int, int]]:
        """Worker w is gone (dead or done): it no longer holds the others back."""
        if w not in self.clock:
            return []
        c = self.clock.pop(w)
        return self._all() if self._leave(c) else []


class OwedTokens:
    """sync and backup: a worker that has pushed waits for a token until the parameters have
    moved past the version it read. Kept by version read, so that an update hands out its
    tokens in O(workers it frees), not O(every waiting worker) at each push."""

    def __init__(self):
        self._by_version: dict[int, list[int]] = {}

    def owe(self, worker: int, version_read: int) -> None:
        """Worker pushed a gradient computed on `version_read`: it is owed a token."""
        self._by_version.setdefault(version_read, []).append(worker)

    def due(self, version: int) -> list[int]:
        """The workers owed a token now that the parameters are at `version`, in the order
        they pushed (oldest version read first); they are owed nothing more."""
        ready = sorted(v for v in self._by_version if v < version)
        return [w for v in ready for w in self._by_version.pop(v)]

    def __len__(self) -> int:
        return sum(len(ws) for ws in self._by_version.values())


def fold_weights(
    ages: list[int], fresh_weight: float = 1.0, decay: float = 0.5, bound: float = 0.5
) -> list[float]:
    """Weights for stale gradients of the given ages (in versions), shrinking as decay**age.

    The weights sum to at most `bound * fresh_weight`: the sufficient condition
    sum(stale alpha) <= (a / 2b) * alpha_t of the backup-worker analysis, with bound = a/(2b).
    """
    if any(age < 1 for age in ages):
        raise ValueError(f"stale gradients have age >= 1, got ages {ages}")
    raw = [fresh_weight * decay**age for age in ages]
    total = sum(raw)
    cap = bound * fresh_weight
    if total > cap > 0:
        raw = [w * cap / total for w in raw]
    elif cap == 0:
        raw = [0.0 for _ in raw]
    return raw


@dataclass
class Push:
    """One gradient message as the PS sees it."""

    worker: int
    step: int  # the worker's local step that produced it (its clock)
    version: int  # the parameter version the gradient was computed on


@dataclass
class Update:
    """One PS update: which pushes it uses, with which weights (the weights sum over pushes)."""

    pushes: list[Push]
    weights: list[float]
    fresh: list[bool]
    dropped: list[Push] = field(default_factory=list)


class BackupAggregator:
    """Apply the first k fresh gradients of each version; drop or fold the late ones.

    sync is the special case k = N with no stale gradients possible.
    """

    def __init__(self, k: int, stale: str = "drop", decay: float = 0.5, bound: float = 0.5):
        self.k, self.stale, self.decay, self.bound = k, stale, decay, bound
        self.version = 0
        self.fresh: list[Push] = []
        self.stale_buf: list[Push] = []
        self.dropped: list[Push] = []

    def offer(self, push: Push) -> Update | None:
        """Take one push; return the Update to apply once k fresh gradients are in, else None."""
        if push.version > self.version:
            raise ValueError(f"push from the future: version {push.version} > {self.version}")
        if push.version == self.version:
            self.fresh.append(push)
        elif self.stale == "fold":
            self.stale_buf.append(push)
        else:
            self.dropped.append(push)
        if len(self.fresh) < self.k:
            return None
        fresh_w = [1.0 / self.k] * self.k
        ages = [self.version - p.version for p in self.stale_buf]
        stale_w = fold_weights(ages, 1.0, self.decay, self.bound)
        update = Update(
            self.fresh + self.stale_buf,
            fresh_w + stale_w,
            [True] * self.k + [False] * len(self.stale_buf),
            self.dropped,
        )
        self.version += 1
        self.fresh, self.stale_buf, self.dropped = [], [], []
        return update


class Downpour:
    """When a Downpour worker fetches parameters and pushes its accumulated gradients."""

    def __init__(self, n_fetch: int = 1, n_push: int = 1):
        self.n_fetch, self.n_push = n_fetch, n_push
        self.pending = 0  # gradients accumulated since the last push

    def fetch(self, step: int) -> bool:
        """True when local step `step` (0-based) starts by pulling fresh parameters."""
        return step % self.n_fetch == 0

    def accumulate(self) -> bool:
        """Count one more local gradient; True when the accumulated sum is due for a push."""
        self.pending += 1
        if self.pending == self.n_push:
            self.pending = 0
            return True
        return False


def ps_fault_task(who) -> int | None:
    """The PS task a fault key names ("ps": task 0, "ps:J": task J), or None for a worker's."""
    who = str(who)
    if who == "ps":
        return 0
    if who.startswith("ps:") and who[3:].isdigit():
        return int(who[3:])
    return None


def staleness(version_read: int, version_before_apply: int) -> int:
    """PS updates applied between a worker's pull and the application of its push."""
    return version_before_apply - version_read


def learning_rate(lr: float, schedule: dict | None, version: int) -> float:
    """The learning rate of update number `version` under an optional schedule."""
    if not schedule:
        return lr
    name = schedule["name"]
    if name == "exponential":
        return lr * schedule["decay_rate"] ** (version / schedule["decay_steps"])
    if name == "inverse_time":
        return lr / (1 + schedule["decay_rate"] * version / schedule["decay_steps"])
    if name == "piecewise":
        values = schedule["values"]
        for boundary, value in zip(schedule["boundaries"], values):
            if version <= boundary:
                return value
        return values[-1]
    raise ValueError(f"unknown lr schedule {name!r}")


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    """Everything a training run needs; JSON-serialisable so every node reads the same file."""

    workers: int
    mode: str = "async"
    model: str = "logreg"
    data: str = "mnist"  # "mnist" or an .npz of features (x_train, y_train, x_test, y_test)
    steps: int = 200  # PS updates (global steps) for the whole run
    batch_size: int = 64
    lr: float = 0.1
    lr_schedule: dict | None = None
    momentum: float = 0.0
    compress: str | dict | None = None  # pushes: None, "float16" or {"topk": fraction}
    n_fetch: int = 1
    n_push: int = 1
    staleness: int = 0  # ssp
    k: int | None = None  # backup: fresh gradients per update (default N - 1)
    stale: str = "drop"  # backup: "drop" or "fold"
    decay: float = 0.5  # backup fold: weight decay per version of age
    fold_bound: float = 0.5  # backup fold: a/(2b), cap of the stale weights over the fresh
    train_size: int | None = 6000  # training examples in total (None = all)
    test_size: int | None = 2000
    stragglers: dict = field(default_factory=dict)  # worker -> factor | {"dist", "mean"}
    faults: dict = field(default_factory=dict)  # "ps" | "ps:J" | worker -> {"kind", "at"}
    checkpoint_every: int = 0  # PS updates between checkpoints (0 = none)
    # PS: give up after this many seconds without a message from any worker (0 = wait
    # forever). For standalone multi-host runs, where no launcher watches the workers.
    worker_timeout: float = 0.0
    resume: bool = False
    evaluator: bool = False  # set by the launcher when the cluster has an evaluator process
    seed: int = 0
    run_id: str = ""
    worker_ids: list = field(default_factory=list)  # the worker tasks taking part

    def to_dict(self) -> dict:
        """Plain dict with string keys (JSON turns int keys into strings anyway)."""
        d = asdict(self)
        d["stragglers"] = {str(k): v for k, v in self.stragglers.items()}
        d["faults"] = {str(k): v for k, v in self.faults.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        """Inverse of to_dict."""
        return cls(**d)


def _positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def validate(cfg: RunConfig) -> RunConfig:
    """Check a RunConfig and fill defaults; raise ValueError naming the value and the remedy."""
    _check_training(cfg)
    _check_mode_options(cfg)
    _check_run(cfg)
    _check_stragglers(cfg)
    _check_faults(cfg)
    return cfg


def _check_training(cfg: RunConfig) -> None:
    """The workers, mode, model, data, steps, batch, learning rate and compression."""
    _positive_int("workers", cfg.workers)
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}: use one of {', '.join(MODES)}")
    if cfg.model not in MODELS:
        raise ValueError(f"unknown model {cfg.model!r}: use one of {', '.join(MODELS)}")
    if cfg.data != "mnist" and not str(cfg.data).endswith(".npz"):
        raise ValueError(
            f"data must be 'mnist' or the path of an .npz file holding x_train, "
            f"y_train, x_test, y_test (e.g. DBpedia features), got {cfg.data!r}"
        )
    if cfg.model == "lenet" and cfg.data != "mnist":
        raise ValueError(f"model 'lenet' needs 28x28 images: use data='mnist', got {cfg.data!r}")
    _positive_int("steps", cfg.steps)
    _positive_int("batch_size", cfg.batch_size)
    _positive_int("n_fetch", cfg.n_fetch)
    _positive_int("n_push", cfg.n_push)
    if not (isinstance(cfg.lr, (int, float)) and cfg.lr > 0 and math.isfinite(cfg.lr)):
        raise ValueError(f"lr must be a positive number, got {cfg.lr!r}")
    if not 0 <= cfg.momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {cfg.momentum!r}")
    if cfg.lr_schedule:
        learning_rate(1.0, cfg.lr_schedule, 1)  # raises on an unknown name
        if cfg.lr_schedule["name"] != "piecewise" and cfg.lr_schedule.get("decay_steps", 0) <= 0:
            raise ValueError(f"lr_schedule decay_steps must be > 0, got {cfg.lr_schedule!r}")
    compression.check_spec(cfg.compress)


def _check_mode_options(cfg: RunConfig) -> None:
    """The options of the modes (Downpour, SSP, backup); fill backup's default k."""
    if cfg.mode != "async" and (cfg.n_fetch, cfg.n_push) != (1, 1):
        raise ValueError(
            f"n_fetch/n_push apply to mode='async' only, got mode={cfg.mode!r} "
            f"with n_fetch={cfg.n_fetch}, n_push={cfg.n_push}"
        )
    if isinstance(cfg.staleness, bool) or not isinstance(cfg.staleness, int) or cfg.staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {cfg.staleness!r}")
    if cfg.mode == "backup":
        if cfg.k is None:
            cfg.k = max(1, cfg.workers - 1)
        if isinstance(cfg.k, bool) or not isinstance(cfg.k, int) or not 1 <= cfg.k <= cfg.workers:
            raise ValueError(f"k must be between 1 and workers={cfg.workers}, got {cfg.k!r}")
    if cfg.stale not in STALE_POLICIES:
        raise ValueError(f"stale must be 'drop' or 'fold', got {cfg.stale!r}")
    if not 0 < cfg.decay < 1:
        raise ValueError(f"decay must be in (0, 1), got {cfg.decay!r}")
    if not 0 <= cfg.fold_bound <= 1:
        raise ValueError(f"fold_bound (a/2b) must be in [0, 1], got {cfg.fold_bound!r}")


def _check_run(cfg: RunConfig) -> None:
    """Data sizes, checkpoints, worker_timeout, resume; fill the worker ids."""
    for name in ("train_size", "test_size"):
        value = getattr(cfg, name)
        if value is not None:
            _positive_int(name, value)
    if cfg.train_size is not None and cfg.train_size < cfg.workers * cfg.batch_size:
        raise ValueError(
            f"train_size={cfg.train_size} gives each of {cfg.workers} workers less "
            f"than one batch of {cfg.batch_size}: raise train_size"
        )
    _positive_int("checkpoint_every", cfg.checkpoint_every, minimum=0)
    if not (
        isinstance(cfg.worker_timeout, (int, float))
        and not isinstance(cfg.worker_timeout, bool)
        and 0 <= cfg.worker_timeout < math.inf
    ):
        raise ValueError(
            f"worker_timeout must be a number of seconds >= 0 (0 = wait forever), "
            f"got {cfg.worker_timeout!r}"
        )
    if cfg.resume and not cfg.run_id:
        raise ValueError("resume=True needs the run_id of the run to resume")
    if not cfg.worker_ids:
        cfg.worker_ids = list(range(cfg.workers))
    if len(cfg.worker_ids) != cfg.workers:
        raise ValueError(f"worker_ids {cfg.worker_ids} must list {cfg.workers} workers")


def _check_stragglers(cfg: RunConfig) -> None:
    """Each straggler is a worker with a slowdown factor >= 1 or a random delay."""
    for w, spec in cfg.stragglers.items():
        if not str(w).isdigit() or int(w) not in cfg.worker_ids:
            raise ValueError(f"straggler worker {w!r} is not one of the workers {cfg.worker_ids}")
        if isinstance(spec, dict):
            if spec.get("dist") not in STRAGGLER_DISTS or not spec.get("mean", 0) > 0:
                raise ValueError(
                    f"random straggler delays need dist in {STRAGGLER_DISTS} and "
                    f"mean > 0 seconds, got {spec!r}"
                )
        elif not (isinstance(spec, (int, float)) and spec >= 1):
            raise ValueError(
                f"a straggler slowdown factor must be >= 1, got {spec!r} for worker {w}"
            )


def _check_faults(cfg: RunConfig) -> None:
    """Each fault names a PS task or a worker, a kind and the step (or version) it happens at."""
    for who, spec in cfg.faults.items():
        if ps_fault_task(who) is None and (
            not str(who).isdigit() or int(who) not in cfg.worker_ids
        ):
            raise ValueError(
                f"faults are keyed by 'ps' (PS task 0), 'ps:J' (PS task J of a "
                f"sharded cluster) or a worker in {cfg.worker_ids}, got {who!r}"
            )
        if not isinstance(spec, dict) or spec.get("kind") not in FAULT_KINDS:
            raise ValueError(f"a fault is {{'kind': 'kill'|'hang', 'at': step}}, got {spec!r}")
        _positive_int(f"fault step for {who}", spec.get("at"), minimum=0)
