"""One rank's model and engine, built the same way on rank 0 and on every worker.

Why this module exists: the ranks must agree on everything a forward depends on (the dtype
that ``auto`` chose, packing, the C++ ops, the attention path, the pool's size, graphs), and a
worker on another machine cannot decide those for itself: its CPU may time bf16 differently.
Rank 0 decides, writes the decisions into a ``RankSpec``, broadcasts it as JSON once at start,
and every rank, rank 0 included, builds from the same spec with the same two functions.

Start-up is two checkpoints, each an all-reduce of a failure flag, so that a rank whose load
fails stops every rank with its reason instead of leaving the others waiting in a collective:
after the weights (``checkpoint("load")``) and after the engine (graph capture runs forwards).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from nanoserve.config import ModelConfig
from nanoserve.model.prepare import prepare_model
from nanoserve.model.weights import DTYPES
from nanoserve.tp.comm import Comm
from nanoserve.tp.load import load_shard
from nanoserve.tp.shard import ShardPlan


@dataclass
class RankSpec:
    model: str
    dtype: str  # the resolved dtype's name: "float32", "bfloat16"
    device: str
    tp: int
    threads_bind: str
    prepack: bool
    small_gemm: bool
    kernels: bool
    engine: dict  # Engine's keyword arguments, attention resolved, the pool sized

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        return cls(**json.loads(text))

    def device_of(self, rank: int) -> torch.device:
        """A card per rank (``cuda:rank``) or the CPU."""
        dev = torch.device(self.device)
        return torch.device("cuda", rank) if dev.type == "cuda" else dev


def share_spec(comm: Comm, spec: RankSpec | None) -> RankSpec:
    """Rank 0's spec on every rank: its length, then its bytes, in two broadcasts."""
    data = spec.to_json().encode() if comm.rank == 0 else b""
    n = comm.broadcast(torch.tensor([len(data)], dtype=torch.long, device=comm.device))
    buf = torch.zeros(int(n.item()), dtype=torch.uint8)
    if comm.rank == 0:
        buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buf = comm.broadcast(buf.to(comm.device)).cpu()
    return RankSpec.from_json(bytes(buf.tolist()).decode())


def checkpoint(comm: Comm, stage: str, error: BaseException | None) -> None:
    """Every rank says whether ``stage`` worked; one failure fails them all, with the failing
    ranks named (and rank 0's own error chained)."""
    flags = torch.zeros(comm.world, dtype=torch.long, device=comm.device)
    flags[comm.rank] = int(error is not None)
    failed = [r for r, f in enumerate(comm.all_reduce(flags).tolist()) if f]
    if failed:
        why = f": {type(error).__name__}: {error}" if error is not None else ""
        raise RuntimeError(f"tensor parallelism: {stage} failed on rank(s) {failed} "
                           f"(rank {comm.rank} here{why})") from error


def build_model(spec: RankSpec, comm: Comm) -> torch.nn.Module:
    """This rank's shard of the model, packed and fused as rank 0 decided."""
    plan = ShardPlan(ModelConfig.from_dir(spec.model), spec.tp, comm.rank)
    model = load_shard(spec.model, plan, comm, DTYPES[spec.dtype], spec.device_of(comm.rank),
                       spec.engine.get("max_model_len"))
    prepare_model(model, spec.prepack, spec.small_gemm, spec.kernels)
    return model


def build_engine(spec: RankSpec, model, cls):
    """``cls`` (rank 0's ``TPEngine`` or a worker's plain ``Engine``) over ``model``."""
    kw = dict(spec.engine)
    kw["fail_on_step"] = frozenset(kw.get("fail_on_step", ()))
    return cls(model, **kw)
