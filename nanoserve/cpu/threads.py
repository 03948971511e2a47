"""Which CPU each compute thread runs on: the engine pins its OpenMP team, one thread a core.

Why this module exists: a decode step is a string of short parallel regions, each ending in a
barrier. A worker that the OS migrates, or that shares a core with its sibling hyperthread or
with the server's event loop, makes every barrier wait for it. vLLM's CPU worker therefore pins
each OpenMP thread to one physical core (``VLLM_CPU_OMP_THREADS_BIND``, default ``auto``), and so
does this engine (``threads_bind``, flag ``--threads-bind``):

- ``auto``: one thread per physical core the process may run on (the first logical CPU of each
  core, siblings skipped), as many as ``torch.get_num_threads()``;
- ``nobind``: leave the OS to place threads, as before;
- a CPU list such as ``0-3,8``: exactly those CPUs, one thread each.

The binding goes through the C++ op ``bind_threads`` (``csrc/threads.cpp``), the only way into
the OpenMP workers. It belongs to the thread that runs the forwards: ``AsyncLLM``'s engine
thread is pinned for its life; ``LLM`` pins the calling thread's team for the duration of
``generate`` and gives the caller its own affinity back afterwards, so threads the caller starts
later do not inherit a one-core mask. Without the C++ ops ``auto`` binds nothing and says why.

    binding = plan("auto")        # Binding(cpus=[0, 1], reason='...')
    with pinned(binding): ...     # the forwards of this thread run on those cores
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from nanoserve.config.cpus import check_spec, parse_cpus
from nanoserve.cpu import csrc


@dataclass(frozen=True, slots=True)
class Binding:
    cpus: tuple[int, ...]  # thread t runs on cpus[t]; empty: not bound
    reason: str
    threads: int = 0  # unbound, but this many compute threads (one rank of several); 0: as is

    def describe(self) -> str:
        if not self.cpus:
            return f"not pinned ({self.reason})"
        n = len(self.cpus)
        return f"{n} thread{'s' * (n > 1)} pinned to CPU{'s' * (n > 1)} " \
               f"{','.join(map(str, self.cpus))} ({self.reason})"


def physical_cores(allowed: set[int], sysfs: Path = Path("/sys/devices/system/cpu")
                   ) -> list[int]:
    """The first allowed logical CPU of each physical core, in order (siblings skipped)."""
    seen, out = set(), []
    for cpu in sorted(allowed):
        topo = sysfs / f"cpu{cpu}" / "topology"
        try:
            core = ((topo / "physical_package_id").read_text().strip(),
                    (topo / "core_id").read_text().strip())
        except OSError:
            core = ("?", str(cpu))
        if core not in seen:
            seen.add(core)
            out.append(cpu)
    return out


def _share(cpus: list[int], rank: int, ranks: int) -> list[int]:
    """Rank ``rank``'s equal share of ``cpus`` (at least one, shared only when too few)."""
    per = len(cpus) // ranks
    return cpus[rank * per:(rank + 1) * per] if per else [cpus[rank % len(cpus)]]


def plan(spec: str, device: torch.device | str = "cpu", rank: int = 0,
         ranks: int = 1) -> Binding:
    """What ``spec`` means on this machine: the CPUs, or why none. With ``ranks`` > 1
    (tensor parallelism, one process per rank on this machine) each rank gets its own equal
    share of the cores, so the ranks never compete for one."""
    check_spec(spec)
    if torch.device(device).type != "cpu":
        return Binding((), f"threads_bind is a CPU setting (device is {torch.device(device)})")
    allowed = os.sched_getaffinity(0)
    of = f", rank {rank} of {ranks}" if ranks > 1 else ""
    if spec == "nobind":
        threads = max(1, len(physical_cores(allowed)) // ranks) if ranks > 1 else 0
        return Binding((), f"threads_bind=nobind{of}", threads)
    why_not = csrc.load()
    if spec == "auto":
        cores = physical_cores(allowed)
        if why_not:
            return Binding((), f"auto binds through the C++ ops, which are off: {why_not}",
                           max(1, len(cores) // ranks) if ranks > 1 else 0)
        if ranks > 1:
            cpus = tuple(_share(cores, rank, ranks))
        else:
            cpus = tuple(cores[:max(1, min(torch.get_num_threads(), len(cores)))])
        return Binding(cpus, f"auto: one thread per physical core, {len(cores)} allowed{of}")
    cpus = parse_cpus(spec)
    if not set(cpus) <= allowed:
        raise ValueError(f"threads_bind={spec!r}: CPUs {sorted(set(cpus) - allowed)} are not "
                         f"among the {sorted(allowed)} this process may use")
    if why_not:
        raise ValueError(f"threads_bind={spec!r} needs the C++ ops: {why_not}")
    return Binding(tuple(_share(cpus, rank, ranks)) if ranks > 1 else tuple(cpus),
                   f"threads_bind={spec}{of}")


def bind(binding: Binding) -> None:
    """Pin the calling thread's OpenMP team as planned (the caller becomes thread 0)."""
    if binding.cpus:
        torch.ops.nanoserve.bind_threads(list(binding.cpus))
    elif binding.threads:
        torch.set_num_threads(binding.threads)


@contextlib.contextmanager
def pinned(binding: Binding):
    """Run the body with this thread's team pinned; give the caller its own mask and torch's
    thread count back after. The workers stay pinned: idle between calls, bound again at the
    next."""
    if not binding.cpus and not binding.threads:
        yield
        return
    mine, threads = os.sched_getaffinity(0), torch.get_num_threads()
    bind(binding)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
        torch.set_num_threads(threads)
