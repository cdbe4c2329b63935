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
  on a core, push (every n_push-th step), then sleep a straggler's delay (no core), drawn as
  worker.py draws it: a slowdown factor stretches the step's call (pull, compute and push;
  in sync, SSP and backup, whose pull holds the wait for the token, compute and push);
- async: each push applies under the next ticket, one at a time on the PS; its staleness is the
  updates applied since the worker read the parameters;
- sync and backup: PS task 0's loop takes the pushes in arrival order, decides with
  protocol.BackupAggregator (the first k fresh gradients; late ones dropped or folded with
  protocol.fold_weights), applies an update, and hands a token to every worker whose push it
  has seen once the version has moved past what that worker read;
- SSP: the loop applies every push and hands out the tokens protocol.SSPGate frees;
- the PS's own work per worker step (serving its pull, taking its push: Costs.serve_s) is done
  by each PS task one request at a time, so one PS saturates as workers are added;
- P PS tasks: a step's serving and an update's apply are split over them, each on a core,
  except the share of the serving every task pays per request, one task after another
  (Costs.serve_fixed: a round trip each), plus a fixed cost per update for coordinating them;
  PS task 0 alone decides;
- shared cores: with Costs.cores set, everything a process does (a worker's pull, compute and
  push, the PS's serving and applying, and Costs.background_s per step off the step's path)
  waits for one of that many cores (first come, first served), as a run's processes contend on
  a small machine.

SimPy runs the events: a well-kept discrete-event library whose processes are Python
generators, so a worker's loop reads as the engine's does; its overhead per event (a few
microseconds) keeps 1,000 workers x 1,000 sync updates within a minute.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque

import numpy as np
import simpy

from helpers.cluster import protocol
from helpers.sim.costs import Costs, SimResult

__all__ = ["Costs", "SimResult", "simulate"]

_DRAWS = 1024  # random draws made at once per worker


class _Sim:
    def __init__(self, cfg: protocol.RunConfig, costs: Costs, ps: int, seed: int, numerics=None):
        self.cfg, self.costs, self.ps, self.numerics = cfg, costs, ps, numerics
        self.read_of = {w: 0 for w in cfg.worker_ids}  # the version each worker last read
        self.env = simpy.Environment()
        self.cores = simpy.Resource(self.env, costs.cores) if costs.cores else None
        # each PS task serves and applies one request at a time
        self.ps_tasks = [simpy.Resource(self.env, 1) for _ in range(ps)]
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
        self.pulls: list[float] = []
        self.pushes: list[float] = []
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

    def _delay_s(self, w: int, step_s: float) -> float:
        """A straggler's extra sleep, drawn by worker.py's rule."""
        spec = self.cfg.stragglers.get(str(w), self.cfg.stragglers.get(w))
        return protocol.straggler_delay(spec, step_s, self.rng[w])

    def _on_core(self, seconds: float):
        """Hold a core (when cores are shared) for `seconds`."""
        if self.cores is None:
            yield self.env.timeout(seconds)
            return
        with self.cores.request() as req:
            yield req
            yield self.env.timeout(seconds)

    def _on_task(self, j: int, seconds: float):
        """PS task j's work: one request at a time, on a core when cores are shared."""
        with self.ps_tasks[j].request() as req:
            yield req
            yield from self._on_core(seconds)

    def _on_ps(self, split: float, each: float = 0.0, coordinate: bool = False):
        """Work of the whole PS: `split` seconds shared out over its tasks, in parallel, and
        `each` on every task, one task after another (a request's round trip: with the
        parameters sharded a step's call first reads the version on task 0, then the pieces,
        and an update is coordinated from task 0), plus their coordination per update
        (`coordinate`) when there are several. No work takes no turn."""
        if split + each <= 0 and not (coordinate and self.ps > 1 and self.costs.shard_s):
            return
        if self.ps == 1:
            yield from self._on_task(0, split + each)
            return
        if each:
            for j in range(self.ps):
                yield from self._on_task(j, each)
        if split:
            parts = [self.env.process(self._on_task(j, split / self.ps)) for j in range(self.ps)]
            yield self.env.all_of(parts)
        if coordinate and self.costs.shard_s:
            yield self.env.timeout(self.costs.shard_s)

    def _apply(self):
        """One update's apply: split over the PS tasks, each on a core, plus coordination."""
        yield from self._on_ps(self.costs.apply_s, coordinate=True)

    def _serve(self, extra: float = 0.0, coordinate: bool = False):
        """Half a step's serving (a pull, or a push with `extra` apply), its fixed share paid
        by every PS task."""
        half, fixed = self.costs.serve_s / 2, self.costs.serve_fixed
        yield from self._on_ps(half * (1 - fixed) + extra, half * fixed, coordinate)

    def _worker_cpu(self, seconds: float):
        """The worker's side of a transfer: on a core when cores are shared."""
        if self.cores is None:
            yield self.env.timeout(seconds)
        else:
            yield from self._on_core(seconds)

    def _call(self, mine: float, served):
        """One remote call: the worker's side (`mine` seconds, half each way), the round
        trip's latency (half each way) and the PS's side (`served`, a generator) between."""
        half, lat = mine / 2, self.costs.latency_s / 2
        if half:
            yield from self._worker_cpu(half)
        if lat:
            yield self.env.timeout(lat)
        yield from served
        if lat:
            yield self.env.timeout(lat)
        if half:
            yield from self._worker_cpu(half)

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
            called = env.now
            pull = c.pull_s if fetch else 0.0
            phased = self.cores is not None or bool(c.serve_s)
            if not phased:
                # pull, compute and push as one event: the version read half-way through the
                # pull (on the PS, as the token is taken) is looked up in the updates' times
                lat = c.latency_s
                read_at = env.now + (pull + lat) / 2
                yield env.timeout(pull + compute + c.push_s * push + lat * (fetch + push))
                if waits:
                    called += pull
                if fetch:
                    read = bisect_right(self.update_t, read_at)
                    self.read_of[w] = read
            else:
                if fetch:
                    yield from self._call(pull, self._read(w))
                    read = self.read_of[w]
                    self.pulls.append(env.now - called)
                if waits:
                    called = env.now
                yield from self._on_core(compute)
                pushed = env.now
                if push and cfg.mode != "async":  # async: with its apply, below
                    yield from self._call(c.push_s, self._serve())
            if self.over.triggered:
                return
            if push:
                if cfg.mode == "async":
                    yield from self._apply_async(w, step, read, phased)
                else:
                    self._send(protocol.Push(w, step, read))
                if phased:
                    self.pushes.append(env.now - pushed)
            if c.background_s and self.cores is not None:
                env.process(self._on_core(c.background_s))
            self.steps[w] += 1
            step += 1
            # a straggler sleeps after its step's call, as worker.py's _delay does
            delay = self._delay_s(w, env.now - called)
            if delay:
                yield env.timeout(delay)

    def _send(self, item) -> None:
        """A message to PS task 0's loop: a push, or a worker's death."""
        self.inbox.append(item)
        if self.ps_idle is not None:
            idle, self.ps_idle = self.ps_idle, None
            idle.succeed()

    def _read(self, w: int):
        """The PS's side of a pull: served in turn, the version read as it is."""
        if self.costs.serve_s:
            yield from self._serve()
        self.read_of[w] = self.version

    def _apply_async(self, w: int, step: int, read: int, phased: bool):
        """An async push: the worker's call, the PS applying it under the next ticket (the
        call's own costs are in the step's one event when it is not simulated `phased`)."""
        applied = self._applied(w, step, read)
        yield from self._call(self.costs.push_s, applied) if phased else applied

    def _applied(self, w: int, step: int, read: int):
        ticket = self.ticket  # numbered as the pushes reach the PS
        self.ticket += 1
        yield from self._serve(self.costs.apply_s, coordinate=True)
        if self.version < self.cfg.steps:
            self.stale.append(protocol.staleness(read, ticket))
            if self.numerics is not None:
                self.numerics.update([protocol.Push(w, step, read)], [1.0], self.env.now)
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
        if self.numerics is not None and self.version % len(self.read_of) == 0:
            self.numerics.prune(min(self.read_of[w] for w in self.live) if self.live else 0)
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
            if c.decide_s:  # PS task 0's Python: on a core when cores are shared
                yield from self._on_core(c.decide_s)
            if self.agg is None:  # SSP: every push is an update
                before = self.version
                yield from self._apply()
                self.stale.append(protocol.staleness(push.version, before))
                if self.numerics is not None:
                    self.numerics.update([push], [1.0], self.env.now)
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
                if self.numerics is not None:
                    self.numerics.update(update.pushes, update.weights, self.env.now)
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
            pulls=np.array(self.pulls),
            pushes=np.array(self.pushes),
            dead=self.dead,
            error=self.error,
            accuracy=self.numerics.accuracy if self.numerics is not None else [],
            test_accuracy=self.numerics.test_accuracy() if self.numerics is not None else None,
        )


def simulate(
    cfg: protocol.RunConfig, costs: Costs, ps: int = 1, seed: int = 0, numerics=None
) -> SimResult:
    """Simulate one run of `cfg` (a validated protocol.RunConfig) with these costs on `ps` PS
    tasks; the same seed gives the same result. `numerics`: a helpers.sim.numerics.Numerics
    of the same configuration, to compute the gradients for real (accuracy), or None."""
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
    if numerics is not None and numerics.cfg is not cfg:
        raise ValueError("numerics must be made from the same configuration: Numerics(cfg)")
    return _Sim(cfg, costs, ps, seed, numerics).run()
