"""Rank 0's side: start (or join) the workers, announce every forward, stop them at the end.

Why this module exists: the engine on rank 0 is the ordinary ``Engine`` with two changes,
both here. ``TPEngine`` journals its cache (``mirror.MirroredCache``) and, before each forward,
broadcasts what the workers must run (``protocol.send``): one message per forward, never per
token, never logits. ``Executor`` owns the workers' lives:

- ``distributed_executor_backend="mp"``: ``start`` spawns ranks 1..tp-1 with
  ``torch.multiprocessing`` (spawn, one process each) over a private group on a free port of
  127.0.0.1, so several engines can live in one process, one after another or side by side;
- ``"external_launcher"``: ``torchrun`` started every rank; rank 0 joins their group.

Start-up (a spawned worker imports torch, loads its shard and builds its engine) may take up to
``STARTUP_S`` or ``distributed_timeout_s``, whichever is longer; a worker that dies during it is
reported at once with its exit code. After that, a worker that dies or hangs fails the engine
within ``distributed_timeout_s``: the collective
rank 0 is in raises (at once for a broken connection, at the timeout for a silent rank), and
``TPEngine`` turns that into ``EngineBroken`` naming what happened to each worker process it
started. ``shutdown`` (``LLM.shutdown()``, a ``with LLM(...)`` block's end, ``AsyncLLM.stop``,
or the interpreter's exit) sends ``STOP``, waits for the processes, and kills any that
remain, so no process outlives the engine.
"""

from __future__ import annotations

import atexit
import time
import weakref

import torch.multiprocessing as mp

from nanoserve.engine.engine import Engine, EngineBroken
from nanoserve.tp import protocol
from nanoserve.tp.comm import Comm
from nanoserve.tp.mirror import MirroredCache
from nanoserve.tp.rank import RankSpec, build_engine, build_model, checkpoint, share_spec
from nanoserve.tp.worker import spawn_entry

JOIN_S = 10.0  # how long shutdown waits for a worker to exit after STOP before killing it
STARTUP_S = 300.0  # the least start-up may take: spawn, import torch, load a shard, build


def startup_s(timeout_s: float) -> float:
    """How long rank 0 waits for the workers to start: never less than ``STARTUP_S``, so a
    short step timeout does not fail a worker that is still importing torch."""
    return max(timeout_s, STARTUP_S)


class Executor:
    def __init__(self, comm: Comm, processes: list, timeout_s: float):
        self.comm, self.processes, self.timeout_s = comm, processes, timeout_s
        self.closed = self.failed = False
        atexit.register(_shutdown_ref, weakref.ref(self))

    @classmethod
    def start(cls, spec: RankSpec, backend: str, timeout_s: float) -> Executor:
        """Rank 0 of ``spec.tp`` ranks: the workers started (mp) or joined (torchrun)."""
        if backend == "external_launcher":
            comm = Comm.from_env(spec.device_of(0), timeout_s)
            if comm.world != spec.tp:
                raise ValueError(f"tensor_parallel_size={spec.tp} but torchrun started "
                                 f"WORLD_SIZE={comm.world} ranks")
            return cls(comm, [], timeout_s)
        comm = None
        ctx = mp.get_context("spawn")
        procs = []
        try:
            comm_store = Comm.create_store(startup_s(timeout_s))
            for r in range(1, spec.tp):
                p = ctx.Process(target=spawn_entry, name=f"nanoserve-tp-rank{r}", daemon=True,
                                args=(r, spec.tp, "127.0.0.1", comm_store.port,
                                      str(spec.device_of(r)), startup_s(timeout_s)))
                p.start()
                procs.append(p)
            _wait_up(comm_store, procs, startup_s(timeout_s))
            comm = Comm.create(0, spec.tp, device=spec.device_of(0), timeout_s=timeout_s,
                               store=comm_store)
        except BaseException:
            for p in procs:
                p.kill()
            raise
        return cls(comm, procs, timeout_s)

    def health(self) -> str:
        """What each worker process this executor started is doing (exit codes)."""
        if not self.processes:
            return "the workers were started by torchrun; see their logs"
        return "; ".join(f"rank {r} (pid {p.pid}) " + ("alive" if p.is_alive() else
                                                       f"exited with code {p.exitcode}")
                         for r, p in enumerate(self.processes, start=1))

    def send(self, message: protocol.Message) -> None:
        try:
            protocol.send(self.comm, message)
        except RuntimeError as e:
            raise self.broken(e) from e

    def broken(self, error: BaseException) -> EngineBroken:
        self.failed = True  # shutdown kills at once: a broken worker will not hear STOP
        return EngineBroken(f"tensor parallelism: a worker rank stopped answering within "
                            f"distributed_timeout_s={self.timeout_s:g} ({self.health()}): "
                            f"{error}")

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.comm.group is not None and not self.failed and \
                all(p.is_alive() for p in self.processes):
            try:
                protocol.send(self.comm, protocol.Message(protocol.STOP, [], [], frozenset(),
                                                          []))
            except RuntimeError:
                pass  # a worker is gone already; it is killed below if still running
        deadline = time.monotonic() + (0.0 if self.failed else JOIN_S)
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)
        self.comm.close()


def _wait_up(store, procs: list, timeout_s: float) -> None:
    """Until every spawned worker has reached the store: a worker that dies first (a script
    without ``if __name__ == "__main__":`` re-runs itself in the child and fails there) is
    reported at once with its exit code, not after the timeout."""
    deadline = time.monotonic() + timeout_s
    for r, p in enumerate(procs, start=1):
        while not store.check([f"nanoserve/up/{r}"]):
            if not p.is_alive():
                raise RuntimeError(
                    f"tensor parallelism: worker rank {r} exited with code {p.exitcode} before "
                    f"it joined (its log is above). Workers are spawned processes that import "
                    f"the main module again: a script that builds an engine with "
                    f"tensor_parallel_size > 1 must do so under if __name__ == '__main__':")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor parallelism: worker rank {r} did not join within "
                                   f"{timeout_s:g} s of start-up")
            time.sleep(0.01)


def _shutdown_ref(ref) -> None:
    ex = ref()
    if ex is not None:
        ex.shutdown()


class TPEngine(Engine):
    """Rank 0's engine: each forward announced to the workers, its cache journaled."""

    cache_class = MirroredCache

    def __init__(self, model, executor: Executor, **kw):
        self.executor = executor
        super().__init__(model, **kw)
        # Whatever building did to the cache (a graph capture's rows), every worker's build did
        # too: the first forward's journal starts from here.
        self.cache.take_journal()

    def _announce(self, kind: int, rows, token_lists, hold=frozenset(), want=()) -> None:
        self.executor.send(protocol.Message(kind, list(rows), [list(t) for t in token_lists],
                                            frozenset(hold), self.cache.take_journal(),
                                            list(want)))

    def prefill(self, rows, token_lists):
        self._announce(protocol.PREFILL, rows, token_lists)
        return self._collective(super().prefill, rows, token_lists)

    def score(self, rows, token_lists, want):  # the workers run the same packed forward
        self._announce(protocol.SCORE, rows, token_lists, want=want)
        return self._collective(super().score, rows, token_lists, want)

    def decode(self, rows, tokens, hold=frozenset()):
        self._announce(protocol.DECODE, rows, [[t] for t in tokens], hold)
        return self._collective(super().decode, rows, tokens, hold)

    def _collective(self, fn, *args):
        try:
            return fn(*args)
        except RuntimeError as e:
            if "gloo" in str(e).lower() or "nccl" in str(e).lower() or \
                    "timed out" in str(e).lower() or "connection" in str(e).lower():
                raise self.executor.broken(e) from e
            raise

    def close(self) -> None:
        self.executor.shutdown()


def start_rank0(spec: RankSpec, backend: str, timeout_s: float):
    """Rank 0's executor, model and engine, the workers built from the same spec."""
    executor = Executor.start(spec, backend, timeout_s)
    try:
        with executor.comm.waiting(startup_s(timeout_s)):
            share_spec(executor.comm, spec)
            model = error = None
            try:
                model = build_model(spec, executor.comm)
            except Exception as e:  # noqa: BLE001 - the workers must hear of it at the checkpoint
                error = e
            checkpoint(executor.comm, "loading the weights", error)
            engine = error = None
            try:
                engine = build_engine(spec, model, lambda m, **kw: TPEngine(m, executor, **kw))
            except Exception as e:  # noqa: BLE001
                error = e
            checkpoint(executor.comm, "building the engine", error)
    except BaseException:
        executor.shutdown()
        raise
    return executor, model, engine
