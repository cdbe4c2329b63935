"""One attempt of a simulated run, in SimPy: its workers, its PS tasks and PS task 0's loop,
from a starting version to an ending one (helpers/sim/simulator.py puts attempts together into
a run, and says what is simulated and how)."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque

import numpy as np
import simpy

from helpers.cluster import protocol
from helpers.sim.costs import Costs, SimResult

_DRAWS = 1024  # random draws made at once per worker


class Attempt:
    """One attempt of a run: from version `start` (0, or a checkpoint's) until version `end`
    (the run's steps, or a PS fault's version)."""

    def __init__(
        self, cfg, costs: Costs, ps: int, seed: int, numerics=None, start: int = 0, end=None
    ):
        self.cfg, self.costs, self.ps, self.numerics = cfg, costs, ps, numerics
        self.start, self.end = start, (cfg.steps if end is None else end)
        self.first = start == 0 and not isinstance(seed, list)
        self.read_of = {w: start for w in cfg.worker_ids}  # the version each worker last read
        self.env = simpy.Environment()
        self.cores = simpy.Resource(self.env, costs.cores) if costs.cores else None
        # each PS task serves and applies one request at a time
        self.ps_tasks = [simpy.Resource(self.env, 1) for _ in range(ps)]
        self.inbox: deque = deque()  # sync, SSP, backup: PS task 0's push queue
        self.ps_idle: simpy.Event | None = None  # PS task 0 waiting for a push
        self.over = self.env.event()
        self.version = start
        self.ticket = start
        self.every = cfg.checkpoint_every
        self.checkpoints = 0
        # async: tickets are handed out up to the next checkpoint; pushes past it wait
        self.block_end = self._next_checkpoint()
        self.block_open = self.env.event()
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
            self.agg.version = start

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

    def _call(self, mine: float, served):
        """One remote call: the worker's side (`mine` seconds, half each way), the round
        trip's latency (half each way) and the PS's side (`served`, a generator) between."""
        half, lat = mine / 2, self.costs.latency_s / 2
        if half:
            yield from self._on_core(half)
        if lat:
            yield self.env.timeout(lat)
        yield from served
        if lat:
            yield self.env.timeout(lat)
        if half:
            yield from self._on_core(half)

    # ------------------------------------------------------------------ the worker
    def worker(self, w: int):
        cfg, env, c = self.cfg, self.env, self.costs
        downpour = protocol.Downpour(cfg.n_fetch, cfg.n_push)
        # a resumed attempt is a new run of the same processes: their faults were the first's
        fault = cfg.faults.get(str(w), cfg.faults.get(w)) if self.first else None
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
                    read = self.start + bisect_right(self.update_t, read_at)
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
        while self.ticket >= self.block_end:  # ps.py's _async_loop: the next block's tickets
            yield self.block_open  # come once the checkpoint is written
        ticket = self.ticket  # numbered as the pushes reach the PS
        self.ticket += 1
        yield from self._serve(self.costs.apply_s, coordinate=True)
        if self.version < self.end:
            self.stale.append(protocol.staleness(read, ticket))
            if self.numerics is not None:
                self.numerics.update([protocol.Push(w, step, read)], [1.0], self.env.now)
            self._updated()

    def _die(self, w: int) -> None:
        self.dead.append(w)
        self.live.discard(w)
        if not self.live and not self.over.triggered:
            self.error = f"every worker died before update {self.end}"
            self.over.succeed()
            return
        self._send(("dead", w))

    # ------------------------------------------------------------------ PS task 0's loop
    def _updated(self) -> None:
        self.version += 1
        self.update_t.append(self.env.now)
        if self.numerics is not None and self.version % len(self.read_of) == 0:
            self.numerics.prune(min(self.read_of[w] for w in self.live) if self.live else 0)
        if self.version >= self.end and not self.over.triggered:
            self.over.succeed()
        elif self.cfg.mode == "async" and self.version == self.block_end:
            self.env.process(self._async_checkpoint())

    def _next_checkpoint(self) -> float:
        """The version of the next checkpoint after this one (inf without checkpoints)."""
        if not self.every:
            return math.inf
        return (self.version // self.every + 1) * self.every

    def _checkpoint(self):
        """PS task 0 writes the parameters (ps.py's _checkpoint), on a core."""
        self.checkpoints += 1
        if self.numerics is not None:
            self.numerics.checkpoint()
        if self.costs.checkpoint_s:
            yield from self._on_core(self.costs.checkpoint_s)

    def _checkpoint_due(self) -> bool:
        """sync, SSP, backup: after an update at a checkpoint's version (not the run's end)."""
        return bool(self.every) and self.version % self.every == 0 and self.version < self.end

    def _async_checkpoint(self):
        """async: every ticket of the block is applied: write, then open the next block."""
        yield from self._checkpoint()
        self.block_end = self._next_checkpoint()
        opened, self.block_open = self.block_open, self.env.event()
        opened.succeed()

    def _hand(self, w: int) -> None:
        """Grant worker w one token (wire.Token): wake it if it waits for one."""
        if w not in self.live:
            return
        self.credits[w] += 1
        wake = self.wake.pop(w, None)
        if wake is not None:
            wake.succeed()

    def ps_task0(self):
        c = self.costs
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
                if self._checkpoint_due():  # after the tokens, as ps.py's _loop
                    yield from self._checkpoint()
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
            if self.version < self.end:  # ps.py's _owe_tokens
                for w in self.owed.due(self.version):
                    self._hand(w)
            if update is not None and self._checkpoint_due():
                yield from self._checkpoint()

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
            checkpoints=self.checkpoints,
            accuracy=self.numerics.accuracy if self.numerics is not None else [],
            test_accuracy=self.numerics.test_accuracy() if self.numerics is not None else None,
        )
