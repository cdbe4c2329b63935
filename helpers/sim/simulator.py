"""A discrete-event simulation of the parameter-server engine: the same run configuration, the
same protocol rules, simulated time instead of processes, so 1,000 workers fit on a laptop.

    from helpers.cluster.protocol import RunConfig, validate
    from helpers.sim.simulator import Costs, simulate
    cfg = validate(RunConfig(workers=100, mode="backup", k=90, steps=1000))
    result = simulate(cfg, Costs(compute_s=0.004, pull_s=0.001, push_s=0.001, apply_s=0.0005))
    result.updates_per_s, result.mean_staleness, result.drops

What is simulated, as the engine does it (helpers/cluster/ps.py and worker.py):
- a worker step: wait for a token (sync, SSP, backup), pull the parameters (every n_fetch-th
  step, Downpour; the version is read on the PS half-way through the pull), compute a gradient
  on a core, push (every n_push-th step), then sleep a straggler's delay (no core);
- async: each push applies under the next ticket, one at a time on the PS; its staleness is the
  updates applied since the worker read the parameters;
- sync and backup: PS task 0's loop takes the pushes in arrival order, decides with
  protocol.BackupAggregator (the first k fresh gradients; late ones dropped or folded with
  protocol.fold_weights), applies an update, and hands a token to every worker whose push it
  has seen once the version has moved past what that worker read;
- SSP: the loop applies every push and hands out the tokens protocol.SSPGate frees;
- P PS tasks: an update's apply is split over them, each on a core, plus a fixed cost per
  update for coordinating them; PS task 0 alone decides;
- shared cores: with Costs.cores set, computing and applying wait for one of that many cores
  (first come, first served), as a run's processes contend on a small machine.

SimPy runs the events: a well-kept discrete-event library whose processes are Python
generators, so a worker's loop reads as the engine's does; its overhead per event (a few
microseconds) keeps 1,000 workers x 1,000 sync updates within a minute.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from helpers.cluster import protocol

_DRAWS = 1024  # random draws made at once per worker


@dataclass
class Costs:
    """Seconds each part of a step costs (calibrated from a real run, or set by hand)."""

    compute_s: float | dict  # a worker's gradient on one batch; a dict: per worker
    compute_cv: float = 0.0  # per-step noise: lognormal with this coefficient of variation
    pull_s: float = 0.0  # one pull of the parameters, every PS task together
    push_s: float = 0.0  # one push's transfer
    apply_s: float = 0.0  # applying one update's gradients, on one PS task
    shard_s: float = 0.0  # per update, with P > 1 PS tasks: coordinating them
    decide_s: float = 0.0  # PS task 0's bookkeeping per push (sync, SSP, backup)
    cores: int | None = None  # cores the run's processes share (None: a core each)

    def __post_init__(self):
        values = self.compute_s.values() if isinstance(self.compute_s, dict) else [self.compute_s]
        for name, value in [("compute_s", v) for v in values] + [
            (n, getattr(self, n))
            for n in ("compute_cv", "pull_s", "push_s", "apply_s", "shard_s", "decide_s")
        ]:
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"Costs.{name} must be a number of seconds >= 0, got {value!r}")
        if self.cores is not None and (not isinstance(self.cores, int) or self.cores < 1):
            raise ValueError(f"Costs.cores must be None or an integer >= 1, got {self.cores!r}")

    def compute_of(self, worker: int) -> float:
        """Worker `worker`'s mean compute seconds per step."""
        if not isinstance(self.compute_s, dict):
            return float(self.compute_s)
        for key in (worker, str(worker)):
            if key in self.compute_s:
                return float(self.compute_s[key])
        raise ValueError(
            f"Costs.compute_s has no time for worker {worker} (it has {sorted(self.compute_s)}): "
            f"give every worker of the run one"
        )


@dataclass
class SimResult:
    """What a simulated run did, in the figures a real run's events give."""

    seconds: float  # simulated wall time from the first step to the last update
    updates: int
    update_t: np.ndarray  # simulated time of each update
    staleness: np.ndarray  # of every gradient applied, in order
    drops: int  # late gradients dropped (backup, drop)
    folded: int  # late gradients folded in (backup, fold)
    steps: dict  # worker -> steps taken
    wait_s: dict  # worker -> seconds spent waiting for a token
    dead: list = field(default_factory=list)  # workers killed by a fault
    error: str | None = None  # why the run could not finish (sync after a lost worker)

    @property
    def updates_per_s(self) -> float:
        return self.updates / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mean_staleness(self) -> float:
        return float(self.staleness.mean()) if len(self.staleness) else float("nan")


class _Sim:
    def __init__(self, cfg: protocol.RunConfig, costs: Costs, ps: int, seed: int):
        self.cfg, self.costs, self.ps = cfg, costs, ps
        self.env = simpy.Environment()
        self.cores = simpy.Resource(self.env, costs.cores) if costs.cores else None
        self.ps_loop = simpy.Resource(self.env, 1)  # async: the PS applies one at a time
        self.inbox: deque = deque()  # sync, SSP, backup: PS task 0's push queue
        self.ps_idle: simpy.Event | None = None  # PS task 0 waiting for a push
        self.over = self.env.event()
        self.version = 0
        self.ticket = 0
        self.stale: list[int] = []
        self.update_t: list[float] = []
        self.drops = self.folded = 0
        self.steps = {w: 0 for w in cfg.worker_ids}
        self.wait_s = {w: 0.0 for w in cfg.worker_ids}
        self.dead: list[int] = []
        self.error = None
        self.credits = {w: 0 for w in cfg.worker_ids}  # tokens granted, not yet taken
        self.wake: dict[int, simpy.Event] = {}  # a worker waiting for a token
        self.owed = protocol.OwedTokens()  # sync, backup: workers that pushed
        self.live = set(cfg.worker_ids)
        seeds = np.random.SeedSequence(seed).spawn(len(cfg.worker_ids))
        self.rng = {w: np.random.default_rng(s) for w, s in zip(cfg.worker_ids, seeds)}
        self.draws = {w: iter(()) for w in cfg.worker_ids}
        self.gate = protocol.SSPGate(cfg.worker_ids, cfg.staleness)
        self.agg = None
        if cfg.mode in ("sync", "backup"):
            k = cfg.workers if cfg.mode == "sync" else cfg.k
            stale = cfg.stale if cfg.mode == "backup" else "drop"
            self.agg = protocol.BackupAggregator(k, stale, cfg.decay, cfg.fold_bound)

    # ------------------------------------------------------------------ a worker's costs
    def _compute_s(self, w: int) -> float:
        """One step's compute time: the worker's mean, with lognormal noise (mean kept)."""
        try:
            return next(self.draws[w])
        except StopIteration:
            mean, cv = self.costs.compute_of(w), self.costs.compute_cv
            if cv > 0:
                sigma = math.sqrt(math.log1p(cv * cv))
                draws = mean * self.rng[w].lognormal(-sigma * sigma / 2, sigma, _DRAWS)
            else:
                draws = np.full(_DRAWS, mean)
            self.draws[w] = iter(draws.tolist())
            return next(self.draws[w])

    def _delay_s(self, w: int, compute_s: float) -> float:
        """A straggler's extra sleep, drawn by worker.py's rule."""
        spec = self.cfg.stragglers.get(str(w), self.cfg.stragglers.get(w))
        return protocol.straggler_delay(spec, compute_s, self.rng[w])

    def _on_core(self, seconds: float):
        """Hold a core (when cores are shared) for `seconds`."""
        if self.cores is None:
            yield self.env.timeout(seconds)
            return
        with self.cores.request() as req:
            yield req
            yield self.env.timeout(seconds)

    def _apply(self):
        """One update's apply: split over the PS tasks, each on a core, plus coordination."""
        c = self.costs
        if self.cores is None:
            yield self.env.timeout(c.apply_s / self.ps + (c.shard_s if self.ps > 1 else 0.0))
            return
        parts = [self.env.process(self._on_core(c.apply_s / self.ps)) for _ in range(self.ps)]
        yield self.env.all_of(parts)
        if c.shard_s:
            yield self.env.timeout(c.shard_s)

    # ------------------------------------------------------------------ the worker
    def worker(self, w: int):
        cfg, env, c = self.cfg, self.env, self.costs
        downpour = protocol.Downpour(cfg.n_fetch, cfg.n_push)
        fault = cfg.faults.get(str(w), cfg.faults.get(w))
        waits = cfg.mode in protocol.WAITING_MODES
        read = 0
        step = 0
        while not self.over.triggered:
            if fault and step == fault["at"]:
                self._die(w)
                return
            if waits:
                if not self.credits[w]:  # the run's end leaves a waiting worker waiting
                    t0 = env.now
                    self.wake[w] = env.event()
                    yield self.wake[w]
                    self.wait_s[w] += env.now - t0
                self.credits[w] -= 1
            fetch, push = downpour.fetch(step), downpour.accumulate()
            compute = self._compute_s(w)
            delay = self._delay_s(w, compute)
            pull = c.pull_s if fetch else 0.0
            if self.cores is None:
                # pull, compute and push as one event: the version read half-way through the
                # pull (on the PS, as the token is taken) is looked up in the updates' times
                read_at = env.now + pull / 2
                yield env.timeout(pull + compute + c.push_s * push)
                if fetch:
                    read = bisect_right(self.update_t, read_at)
            else:
                if fetch:
                    if pull:
                        yield env.timeout(pull / 2)
                    read = self.version
                    if pull:
                        yield env.timeout(pull / 2)
                yield from self._on_core(compute)
                if push and c.push_s:
                    yield env.timeout(c.push_s)
            if self.over.triggered:
                return
            if push:
                if cfg.mode == "async":
                    yield from self._apply_async(w, step, read)
                else:
                    self._send(protocol.Push(w, step, read))
            self.steps[w] += 1
            step += 1
            if delay:  # a straggler sleeps after its step, as worker.py's _delay does
                yield env.timeout(delay)

    def _send(self, item) -> None:
        """A message to PS task 0's loop: a push, or a worker's death."""
        self.inbox.append(item)
        if self.ps_idle is not None:
            idle, self.ps_idle = self.ps_idle, None
            idle.succeed()

    def _apply_async(self, w: int, step: int, read: int):
        ticket = self.ticket  # numbered as the pushes arrive
        self.ticket += 1
        with self.ps_loop.request() as req:
            yield req
            yield from self._apply()
        if self.version < self.cfg.steps:
            self.stale.append(protocol.staleness(read, ticket))
            self._updated()

    def _die(self, w: int) -> None:
        self.dead.append(w)
        self.live.discard(w)
        if not self.live and not self.over.triggered:
            self.error = f"every worker died before update {self.cfg.steps}"
            self.over.succeed()
            return
        self._send(("dead", w))

    # ------------------------------------------------------------------ PS task 0's loop
    def _updated(self) -> None:
        self.version += 1
        self.update_t.append(self.env.now)
        if self.version >= self.cfg.steps and not self.over.triggered:
            self.over.succeed()

    def _hand(self, w: int) -> None:
        """Grant worker w one token (wire.Token): wake it if it waits for one."""
        if w not in self.live:
            return
        self.credits[w] += 1
        wake = self.wake.pop(w, None)
        if wake is not None:
            wake.succeed()

    def ps_task0(self):
        cfg, c = self.cfg, self.costs
        while not self.over.triggered:
            if not self.inbox:  # the run's end leaves an idle loop waiting
                self.ps_idle = self.env.event()
                yield self.ps_idle
            push = self.inbox.popleft()
            if isinstance(push, tuple):  # a worker died
                if not self._lost(push[1]):
                    return
                continue
            if c.decide_s:
                yield self.env.timeout(c.decide_s)
            if self.agg is None:  # SSP: every push is an update
                before = self.version
                yield from self._apply()
                self.stale.append(protocol.staleness(push.version, before))
                self._updated()
                for w, _, _ in self.gate.pushed(push.worker):
                    self._hand(w)
                continue
            update = self.agg.offer(push)
            self.drops += len(self.agg.dropped)
            self.agg.dropped.clear()
            if update is not None:
                before = self.version
                yield from self._apply()
                self.folded += update.fresh.count(False)
                self.stale.extend(before - p.version for p in update.pushes)
                self._updated()
            self.owed.owe(push.worker, push.version)
            if self.version < cfg.steps:  # ps.py's _owe_tokens
                for w in self.owed.due(self.version):
                    self._hand(w)

    def _lost(self, w: int) -> bool:
        """A worker died: False when the run cannot go on (ps.py's _on_dead)."""
        cfg = self.cfg
        if cfg.mode == "sync" or (cfg.mode == "backup" and len(self.live) < cfg.k):
            self.error = (
                f"worker {w} died: {cfg.mode} needs "
                f"{cfg.workers if cfg.mode == 'sync' else cfg.k} live workers"
            )
            self.over.succeed()
            return False
        for v, _, _ in self.gate.remove(w):
            self._hand(v)
        return True

    # ------------------------------------------------------------------ the run
    def run(self) -> SimResult:
        cfg = self.cfg
        if cfg.mode == "ssp":
            for w, _, _ in self.gate.start():
                self._hand(w)
        elif cfg.mode in protocol.WAITING_MODES:
            for w in cfg.worker_ids:
                self._hand(w)
        for w in cfg.worker_ids:
            self.env.process(self.worker(w))
        if cfg.mode != "async":
            self.env.process(self.ps_task0())
        self.env.run(until=self.over)
        return SimResult(
            seconds=self.update_t[-1] if self.update_t else 0.0,
            updates=self.version,
            update_t=np.array(self.update_t),
            staleness=np.array(self.stale, dtype=np.int64),
            drops=self.drops,
            folded=self.folded,
            steps=self.steps,
            wait_s=self.wait_s,
            dead=self.dead,
            error=self.error,
        )


def simulate(cfg: protocol.RunConfig, costs: Costs, ps: int = 1, seed: int = 0) -> SimResult:
    """Simulate one run of `cfg` (a validated protocol.RunConfig) with these costs on `ps` PS
    tasks; the same seed gives the same result."""
    if ps < 1 or isinstance(ps, bool) or not isinstance(ps, int):
        raise ValueError(f"ps must be an integer >= 1, got {ps!r}")
    protocol.validate(cfg)
    if (
        cfg.resume
        or cfg.checkpoint_every
        or any(protocol.ps_fault_task(k) is not None for k in cfg.faults)
    ):
        raise ValueError(
            "checkpoints, resumes and PS faults are not simulated yet: drop checkpoint_every, "
            "resume and the 'ps' faults from the configuration"
        )
    return _Sim(cfg, costs, ps, seed).run()
