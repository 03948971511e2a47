"""The ranks' one channel: a torch.distributed process group, and what crossed it.

Why this module exists: every byte that moves between ranks moves here, through
torch.distributed's own backends (gloo between CPU processes, NCCL between cards), so the
tensor-parallel model, the step broadcast and the Day-66 accounting all see one object. Two
ways in:

- ``Comm.create(rank, world, host, port)``: a private group over its own ``TCPStore`` (rank 0
  listens, on a free port when ``port`` is 0). Nothing global is touched, so several engines
  can live in one process, one after another or side by side, each with its own group;
- ``Comm.from_env()``: the ranks ``torchrun`` started (``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``), through ``init_process_group`` as any torchrun script does.

Every collective is counted (calls, bytes, seconds inside it) in ``CommStats``: the bytes are
the tensors' own sizes, the seconds include waiting for the slowest rank.

The timeout is the longest one collective may wait. Rank 0 gives ``distributed_timeout_s``, so
a worker that dies or hangs fails the step within it; a worker waits between steps for as long
as the server is idle, so its own waits are unbounded (``IDLE_TIMEOUT``). Start-up is slower
than a step (a spawned worker imports torch and loads its shard), so rank 0 waits on it under
``Comm.waiting(seconds)``, which gives each collective of a private group its own longer
timeout; a group torchrun made (``from_env``) keeps the timeout it was made with.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

IDLE_TIMEOUT = datetime.timedelta(days=7)  # a worker between steps: the server may be idle


@dataclass
class CommStats:
    """What crossed the group, by kind of collective: calls, bytes, seconds."""

    calls: dict[str, int] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int, seconds: float) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.nbytes[kind] = self.nbytes.get(kind, 0) + nbytes
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds

    def reset(self) -> None:
        self.calls.clear()
        self.nbytes.clear()
        self.seconds.clear()

    def total_seconds(self) -> float:
        return sum(self.seconds.values())


# The model's two collectives as opaque custom ops, so that ``torch.compile`` (Day 49) traces a
# tensor-parallel forward whole and calls them as it calls the C++ ops: a handle (an int) names
# the group, since a process group is not a value a graph can hold.
_LIVE: dict[int, Comm] = {}
_HANDLES = itertools.count(1)


@torch.library.custom_op("nanoserve_tp::all_reduce", mutates_args=("x",))
def _all_reduce_op(x: torch.Tensor, handle: int) -> None:
    _LIVE[handle].all_reduce(x)


@_all_reduce_op.register_fake
def _(x, handle):
    return None


@torch.library.custom_op("nanoserve_tp::gather_last", mutates_args=())
def _gather_last_op(x: torch.Tensor, handle: int) -> torch.Tensor:
    shards = _LIVE[handle].gather(x.contiguous())
    return x.clone() if shards is None else torch.cat(shards, dim=-1)


@_gather_last_op.register_fake
def _(x, handle):
    comm = _LIVE[handle]
    n = x.shape[-1] * (comm.world if comm.rank == 0 else 1)
    return x.new_empty(*x.shape[:-1], n)


class Comm:
    def __init__(self, rank: int, world: int, group, device: torch.device, store=None,
                 owns_default: bool = False):
        self.rank, self.world, self.group, self.device = rank, world, group, device
        self.store = store  # the rendezvous; rank 0's also carries workers' ready/error keys
        self.owns_default = owns_default
        self.stats = CommStats()
        self.op_timeout: datetime.timedelta | None = None  # set inside ``waiting``
        self.handle = next(_HANDLES)
        _LIVE[self.handle] = self

    def model_all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The model's all-reduce, in place, through the opaque op (compile-safe)."""
        torch.ops.nanoserve_tp.all_reduce(x, self.handle)
        return x

    def model_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0: every rank's ``x`` joined along the last dim; elsewhere ``x`` itself."""
        return torch.ops.nanoserve_tp.gather_last(x, self.handle)

    # ------------------------------------------------------------------ making one

    @classmethod
    def create(cls, rank: int, world: int, host: str = "127.0.0.1", port: int = 0,
               device: torch.device | str = "cpu", timeout_s: float = 60.0,
               store=None) -> Comm:
        """A private group: gloo on a CPU, NCCL on a card, over a TCPStore of its own."""
        device = torch.device(device)
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, world, rank == 0, timeout=timeout,
                                  wait_for_workers=False)
        if rank:  # rank 0 polls for this before it waits in the group's own rendezvous
            store.set(f"nanoserve/up/{rank}", "1")
        group_timeout = timeout if rank == 0 else IDLE_TIMEOUT
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = group_timeout
            group = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, world, opts)
        else:
            group = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world,
                                          group_timeout)
        return cls(rank, world, group, device, store)

    @staticmethod
    def create_store(timeout_s: float = 60.0, host: str = "127.0.0.1"):
        """Rank 0's rendezvous on a free port of ``host``, before any worker exists: the
        workers are told its port and connect to it."""
        return dist.TCPStore(host, 0, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False)

    @classmethod
    def from_env(cls, device: torch.device | str = "cpu", timeout_s: float = 60.0) -> Comm:
        """The group of the ranks torchrun started (the ``external_launcher`` backend)."""
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]
        if missing:
            raise ValueError(f"distributed_executor_backend='external_launcher' runs under "
                             f"torchrun, which sets {missing}; they are not set")
        device = torch.device(device)
        rank = int(os.environ["RANK"])
        timeout = datetime.timedelta(seconds=timeout_s) if rank == 0 else IDLE_TIMEOUT
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=timeout)
        return cls(rank, dist.get_world_size(), dist.group.WORLD, device, owns_default=True)

    @contextlib.contextmanager
    def waiting(self, seconds: float):
        """Inside this block each collective of a private group may wait ``seconds``."""
        before, self.op_timeout = self.op_timeout, datetime.timedelta(seconds=seconds)
        try:
            yield self
        finally:
            self.op_timeout = before

    def _opts(self, opts):
        if self.op_timeout is not None:
            opts.timeout = self.op_timeout
        return opts

    @property
    def port(self) -> int | None:
        return None if self.store is None else self.store.port

    # ------------------------------------------------------------------ collectives

    def _run(self, kind: str, tensor: torch.Tensor, work_fn) -> None:
        t0 = time.perf_counter()
        work_fn().wait()
        self.stats.add(kind, tensor.numel() * tensor.element_size(), time.perf_counter() - t0)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place."""
        if self.owns_default:
            self._run("all_reduce", tensor,
                      lambda: dist.all_reduce(tensor, group=self.group, async_op=True))
        else:
            opts = self._opts(dist.AllreduceOptions())
            self._run("all_reduce", tensor, lambda: self.group.allreduce([tensor], opts))
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.owns_default:
            self._run("broadcast", tensor,
                      lambda: dist.broadcast(tensor, src, group=self.group, async_op=True))
        else:
            opts = self._opts(dist.BroadcastOptions())
            opts.rootRank = src
            self._run("broadcast", tensor, lambda: self.group.broadcast([tensor], opts))
        return tensor

    def gather(self, tensor: torch.Tensor, dst: int = 0) -> list[torch.Tensor] | None:
        """Every rank's ``tensor`` (same shape everywhere) on ``dst``; None elsewhere."""
        outs = [torch.empty_like(tensor) for _ in range(self.world)] if self.rank == dst \
            else None
        if self.owns_default:
            self._run("gather", tensor, lambda: dist.gather(tensor, outs, dst, group=self.group,
                                                            async_op=True))
        else:
            opts = self._opts(dist.GatherOptions())
            opts.rootRank = dst
            self._run("gather", tensor,
                      lambda: self.group.gather([outs] if outs is not None else [], [tensor],
                                                opts))
        return outs

    def close(self) -> None:
        if self.owns_default and dist.is_initialized():
            dist.destroy_process_group()
        self.group = None
        _LIVE.pop(self.handle, None)
