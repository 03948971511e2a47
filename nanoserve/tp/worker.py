"""A worker rank: build the shard rank 0 describes, then run every forward rank 0 announces.

Why this module exists: a worker has no scheduler, no sampler, no server. It waits for the next
message (``protocol.receive``), brings its cache's addressing up to rank 0's (``mirror.replay``),
and calls its own ``Engine.prefill`` or ``Engine.decode`` with the same arguments rank 0 is
calling, so the same code path (packed or padded prefill, the decode read, graph windows) runs
on its heads and meets rank 0's at the same all-reduces. Its logits stay here. It ends on
``STOP``, or when rank 0 goes away (a broken connection; on Linux the process also dies with
its parent).

Two ways to become one: ``spawn_entry`` (``distributed_executor_backend="mp"``: rank 0 started
this process) and ``run_external`` (``external_launcher``: ``torchrun`` started every rank, and
this one is not rank 0).
"""

from __future__ import annotations

import ctypes
import logging
import signal
import sys

import torch

from nanoserve.cpu.threads import bind, plan
from nanoserve.engine.engine import Engine
from nanoserve.tp import protocol
from nanoserve.tp.comm import Comm
from nanoserve.tp.mirror import replay
from nanoserve.tp.rank import RankSpec, build_engine, build_model, checkpoint, share_spec

log = logging.getLogger("nanoserve")


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the process that spawned it exits."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def start_rank(comm: Comm, local_rank: int, local_ranks: int) -> tuple[RankSpec, Engine]:
    """Receive the spec, pin this rank's threads, build its model and engine."""
    spec = share_spec(comm, None)
    binding = plan(spec.threads_bind, spec.device_of(comm.rank), local_rank, local_ranks)
    bind(binding)
    model = error = None
    try:
        model = build_model(spec, comm)
    except Exception as e:  # noqa: BLE001 - every rank must hear of it at the checkpoint
        error = e
    checkpoint(comm, "loading the weights", error)
    engine = None
    try:
        engine = build_engine(spec, model, Engine)
    except Exception as e:  # noqa: BLE001
        error = e
    checkpoint(comm, "building the engine", error)
    log.info("tensor parallelism: %s; %s", model.shard_plan.describe(), binding.describe())
    return spec, engine


def serve(engine: Engine, comm: Comm) -> int:
    """Run rank 0's forwards until STOP; returns how many ran."""
    n = 0
    with torch.inference_mode():
        while True:
            m = protocol.receive(comm)
            if m.kind == protocol.STOP:
                return n
            replay(engine.cache, m.journal)
            if m.kind == protocol.PREFILL:
                engine.prefill(m.rows, m.token_lists)
            elif m.kind == protocol.SCORE:  # packed whatever the policy; as many logits as
                engine.score(m.rows, m.token_lists, m.want)  # rank 0's: the head gathers them
            else:
                engine.decode(m.rows, [t for (t,) in m.token_lists], m.hold)
            n += 1


def spawn_entry(rank: int, world: int, host: str, port: int, device: str,
                timeout_s: float) -> None:
    """The target of a ``torch.multiprocessing`` worker process."""
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING)
    comm = Comm.create(rank, world, host, port, device, timeout_s)
    try:
        _, engine = start_rank(comm, rank, world)
        serve(engine, comm)
    except RuntimeError as e:  # rank 0 went away, or a start-up checkpoint failed
        log.warning("tensor-parallel rank %d stops: %s", rank, e)
    finally:
        comm.close()


def worker_rank(cfg) -> int:
    """This process's rank if ``cfg`` makes it a worker (torchrun's rank > 0 under
    ``external_launcher``), else 0: rank 0 drives, whatever the backend."""
    import os

    if cfg.tensor_parallel_size == 1 or cfg.distributed_executor_backend != "external_launcher":
        return 0
    return int(os.environ.get("RANK", 0))


def run_external(device: str, timeout_s: float) -> int:
    """A rank ``torchrun`` started, other than 0: serve rank 0 until it stops; the forwards
    run. Local rank and local size (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) share the cores."""
    import os

    comm = Comm.from_env(device, timeout_s)
    try:
        _, engine = start_rank(comm, int(os.environ.get("LOCAL_RANK", 0)),
                               int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        return serve(engine, comm)
    finally:
        comm.close()
