"""The roofline: the time a decode step cannot beat, and how far the engine's steps sit above it.

Why this module exists: a speed-up of a decode step is worth only what is left between the step
and the time the hardware needs for it, and nothing else in the package says what that time is.
A decode step reads every weight once, whatever its rows, and multiplies every weight by every
row, so it can take no less than its bytes over the memory bandwidth, nor less than its FLOPs
over the arithmetic peak::

    floor(rows) = max(bytes(rows) / bandwidth, flops(rows) / peak)

The two terms meet at the ridge, the row count past which a step is bound by multiplying rather
than by reading. This module holds the arithmetic (``StepCost``, from a ``ModelConfig``; the
floor and the ridge), the two rates measured on this machine (``machine_arms``: a streaming
read and a large float32 matmul, on the engine's own threads and cores), and the engine's decode
steps at 1 to 64 rows (``step_arms``), so that ``make bench`` and the Day 32 chapter draw the
same floor. Every arm is a zero-argument call that returns its own seconds; ``roofline_arms``
puts them in the order a round runs them, and a caller keeps each one's best over interleaved
rounds (``best_rounds``, or the chapters' ``best_of``) and hands them to ``Roofline.of``.

    python -m nanoserve.bench.roofline                  # torch's threads, as the engine uses
    python -m nanoserve.bench.roofline --threads 1 --rounds 5

```pycon
>>> cost = StepCost.of(ModelConfig.from_dict(shape_config("smollm2-135m")), dtype_bytes=4)
>>> cost.params, cost.weight_bytes, cost.flops_per_row
(134515008, 538060032, 268959744)
>>> round(ridge_rows(cost, context=8, balance=10.0), 1)
20.2

```
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanoserve.bench.shapes import shape_checkpoint, shape_config
from nanoserve.bench.steps import timed_steps
from nanoserve.config import ModelConfig
from nanoserve.cpu import onednn
from nanoserve.cpu.huge_pages import place
from nanoserve.cpu.threads import Binding, pinned
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams

ROWS = (1, 2, 4, 8, 16, 32, 64)
PROMPT = 8  # tokens a prompt: 64 of them fill one step of the offline budget (512)
STEPS = 3  # decode steps a run times, after its prefill
READ_BYTES = 512 * 2**20  # the streamed tensor: far past any processor's last-level cache
MATMUL_N = 2048  # (N, N) @ (N, N) in float32, 2 N^3 FLOPs
Arms = dict[str, Callable[[], float]]


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one decode step of a model costs, on no machine in particular. Per step, every
    weight is read once (``weight_bytes``: every parameter, a tied head once). Per row,
    ``flops_per_row``: two FLOPs per weight of every linear, LM head included (norms, biases and
    the embedding lookup are left out, a rounding error). Per row and per context position the
    row attends to, ``attn_flops_per_position`` (q.k and p.v, two FLOPs per multiply-add, every
    query head of every layer) and ``kv_bytes_per_position`` (that position's K and V, every
    layer)."""

    params: int
    weight_bytes: int
    flops_per_row: int
    attn_flops_per_position: int
    kv_bytes_per_position: int

    @classmethod
    def of(cls, cfg: ModelConfig, dtype_bytes: int = 4) -> StepCost:
        E, inter, L, V = (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                          cfg.vocab_size)
        q, kv = cfg.q_size, cfg.kv_size
        linears = E * (q + 2 * kv) + q * E + E * 2 * inter + inter * E  # qkv, o, gate_up, down
        biases = (q + 2 * kv + E) * cfg.attention_bias + (2 * inter + E) * cfg.mlp_bias
        layer = linears + biases + 2 * E  # and the two norms
        head = 0 if cfg.tie_word_embeddings else V * E
        params = L * layer + V * E + head + E  # the embedding, the untied head, the final norm
        return cls(params=params, weight_bytes=params * dtype_bytes,
                   flops_per_row=2 * (L * linears + V * E),
                   attn_flops_per_position=L * 2 * 2 * q,  # q.k and p.v: 2 FLOPs x q_size each
                   kv_bytes_per_position=L * 2 * kv * dtype_bytes)

    def bytes(self, rows: int, context: int) -> int:
        """Bytes a step reads: every weight, and each row's K/V over ``context`` positions."""
        return self.weight_bytes + rows * context * self.kv_bytes_per_position

    def flops(self, rows: int, context: int) -> int:
        return rows * (self.flops_per_row + context * self.attn_flops_per_position)

    def intensity(self, rows: int, context: int) -> float:
        """FLOPs per byte read: what a step does with each byte it brings in."""
        return self.flops(rows, context) / self.bytes(rows, context)


def floor_s(cost: StepCost, rows: int, context: int, bandwidth: float, peak: float) -> float:
    """The time a step of ``rows`` rows cannot beat: bytes / bandwidth (bytes/s) or FLOPs / peak
    (FLOP/s), whichever is longer."""
    return max(cost.bytes(rows, context) / bandwidth, cost.flops(rows, context) / peak)


def ridge_rows(cost: StepCost, context: int, balance: float) -> float:
    """The rows where the two terms of the floor meet, on a machine whose balance (peak over
    bandwidth) is ``balance`` FLOPs per byte: ``balance * bytes(r) = flops(r)``, both linear in
    r. Infinite when each row's K/V costs more reading than its FLOPs cost multiplying."""
    per_row = cost.flops_per_row + context * (cost.attn_flops_per_position
                                              - balance * cost.kv_bytes_per_position)
    return balance * cost.weight_bytes / per_row if per_row > 0 else math.inf


# ---------------------------------------------------------------------------- the machine

MACHINE_ARMS = ("read", "matmul torch", "matmul onednn")


def machine_arms(binding: Binding, read_bytes: int = READ_BYTES, n: int = MATMUL_N,
                 tries: int = STEPS) -> Arms:
    """The machine's two rates as timed calls, each run on ``binding``'s threads and cores (the
    engine's) and returning the fastest of ``tries`` runs, in seconds. ``read`` sums a float32
    tensor of ``read_bytes`` on 2 MiB pages where the kernel grants them, as the engine's
    streamed weights lie (``nanoserve.cpu.huge_pages``; on 4 KiB pages the same sum reads a few
    percent slower, and a step could then beat its floor). ``matmul torch`` multiplies two
    (n, n) float32 matrices with ``torch.mm``; ``matmul onednn`` does it with oneDNN's packed
    linear, where oneDNN runs here. The peak is the faster of the two: one processor can run
    one library's float32 kernel at a fraction of another's speed."""
    g = torch.Generator().manual_seed(32)
    (stream,), _ = place([torch.rand(read_bytes // 4, generator=g)])  # (read_bytes / 4,) fp32
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)  # (n, n) each

    def timed(fn: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:  # the best of ``tries``: as many chances as a step arm's steps
            best = math.inf
            with torch.inference_mode(), pinned(binding):
                for _ in range(tries):
                    t = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t)
            return best
        return run

    arms = {"read": timed(stream.sum), "matmul torch": timed(lambda: torch.mm(a, b))}
    if onednn.unavailable(torch.device("cpu"), torch.float32) is None:
        from nanoserve.layers.linear_onednn import packed_layer

        packed = packed_layer(b.t().contiguous())  # weight (N, K): x @ b as a linear
        arms["matmul onednn"] = timed(lambda: packed(a))
    return arms


@dataclass(frozen=True, slots=True)
class Machine:
    """The rates a floor is drawn with: ``bandwidth`` in bytes/s, ``peak`` in FLOP/s, and each
    kernel's own rate (``rates``: bytes/s for ``read``, FLOP/s for a matmul)."""

    bandwidth: float
    peak: float
    rates: dict[str, float]

    @property
    def balance(self) -> float:
        """FLOPs the machine can do in the time it reads one byte: the ridge's intensity."""
        return self.peak / self.bandwidth

    @classmethod
    def of(cls, best: dict[str, float], read_bytes: int = READ_BYTES,
           n: int = MATMUL_N) -> Machine:
        """From the machine arms' best seconds: every key that starts with ``read`` is one
        read (``roofline_arms`` runs it beside each step arm), the fastest kept; the other keys
        of ``best`` are ignored."""
        read = min(s for k, s in best.items() if k.startswith("read"))
        rates = {"read": read_bytes / read}
        rates |= {k: 2 * n ** 3 / s for k, s in best.items() if k in MACHINE_ARMS[1:]}
        return cls(rates["read"], max(r for k, r in rates.items() if k != "read"), rates)


# ---------------------------------------------------------------------------- the engine


def step_arms(llm: LLM, rows: tuple[int, ...] = ROWS, prompt: int = PROMPT,
              steps: int = STEPS, seed: int = 32) -> Arms:
    """One timed call per row count, ``rows r``: ``r`` seeded prompts of ``prompt`` token ids
    through ``llm.generate`` (greedy, EOS ignored, ``steps`` + 1 tokens each: a prefill, then
    ``steps`` decode steps of r rows), returning the fastest of those decode steps in seconds,
    as ``nanoserve.bench.steps`` times the engine's step."""
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    vocab = llm.config.vocab_size

    def arm(r: int) -> Callable[[], float]:
        prompts = [torch.randint(2, vocab - 1, (prompt,), generator=g).tolist()
                   for _ in range(r)]

        def run() -> float:
            times: list[float] = []
            kind = f"decode {r}"
            with timed_steps(llm, lambda k, s, _: times.append(s) if k == kind else None):
                llm.generate(prompts, params)
            if len(times) != steps:
                raise RuntimeError(f"{len(times)} steps of {r} rows, {steps} expected: raise "
                                   f"max_num_seqs or the token budget")
            return min(times)
        return run

    return {f"rows {r}": arm(r) for r in rows}


def roofline_arms(llm: LLM, rows: tuple[int, ...] = ROWS) -> Arms:
    """The machine's arms and the engine's, in the order a round runs them: the matmuls, then
    each step arm with a read just before it (``read before rows r``). A shared machine's load
    comes and goes, and a read taken beside every step arm sees the quiet moments the steps see;
    a bandwidth read in a burst of someone else's traffic would draw a floor the steps beat."""
    machine = machine_arms(llm.binding)
    out = {k: fn for k, fn in machine.items() if k != "read"}
    for name, fn in step_arms(llm, rows).items():
        out[f"read before {name}"] = machine["read"]
        out[name] = fn
    return out


def best_rounds(arms: Arms, rounds: int) -> dict[str, float]:
    """Each arm's fewest seconds over ``rounds`` rounds, the arms taking turns in each round, so
    that a burst of load on a shared machine hits all of them alike."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in arms.items():
            best[name] = min(best.get(name, math.inf), fn())
    return best


@dataclass(frozen=True, slots=True)
class Roofline:
    """A model's cost, a machine's rates and the engine's best decode step per row count."""

    cost: StepCost
    machine: Machine
    steps: dict[int, float]  # rows -> seconds
    context: int  # positions every timed row attends to, at least (its prompt)

    @classmethod
    def of(cls, best: dict[str, float], cost: StepCost, context: int = PROMPT,
           read_bytes: int = READ_BYTES, n: int = MATMUL_N) -> Roofline:
        """From the best seconds of ``roofline_arms`` (or of ``machine_arms`` and
        ``step_arms`` together)."""
        steps = {int(k.split()[1]): s for k, s in best.items() if k.startswith("rows ")}
        return cls(cost, Machine.of(best, read_bytes, n), dict(sorted(steps.items())), context)

    def floor(self, rows: int) -> float:
        return floor_s(self.cost, rows, self.context, self.machine.bandwidth, self.machine.peak)

    def bound_by(self, rows: int) -> str:
        """``memory`` or ``compute``: which term of the floor is the longer at ``rows``."""
        c, m = self.cost, self.machine
        read = c.bytes(rows, self.context) / m.bandwidth
        return "memory" if read >= c.flops(rows, self.context) / m.peak else "compute"

    def distance(self, rows: int) -> float:
        """Measured step over its floor: 1 would be a step the hardware cannot beat."""
        return self.steps[rows] / self.floor(rows)

    @property
    def ridge(self) -> float:
        return ridge_rows(self.cost, self.context, self.machine.balance)


def report(rf: Roofline) -> str:
    m = rf.machine
    kernels = ", ".join(f"{k} {r / 1e9:.1f} {'GB' if k == 'read' else 'GFLOP'}/s"
                        for k, r in m.rates.items())
    lines = [f"bandwidth {m.bandwidth / 1e9:.1f} GB/s, peak {m.peak / 1e9:.1f} GFLOP/s "
             f"({kernels}); balance {m.balance:.2f} FLOP/byte, ridge at {rf.ridge:.1f} rows",
             f"{'rows':>5} {'step ms':>8} {'floor ms':>9} {'bound by':>9} {'distance':>9} "
             f"{'GFLOP/s':>8}"]
    for r, s in rf.steps.items():
        lines.append(f"{r:>5} {s * 1e3:>8.2f} {rf.floor(r) * 1e3:>9.2f} {rf.bound_by(r):>9} "
                     f"{rf.distance(r):>8.2f}x {rf.cost.flops(r, rf.context) / s / 1e9:>8.1f}")
    return "\n".join(lines)


def engine(rows: tuple[int, ...] = ROWS, prompt: int = PROMPT, steps: int = STEPS) -> LLM:
    """The default engine on random weights in SmolLM2-135M's shape, float32, with room for
    ``max(rows)`` rows; built on torch's threads as they are now."""
    return LLM(str(shape_checkpoint("smollm2-135m")), dtype="float32", skip_tokenizer_init=True,
               max_num_seqs=max(rows), max_model_len=max(32, prompt + steps + 1))


def main(argv=None) -> None:
    from nanoserve.bench.hardware import describe_hardware

    p = argparse.ArgumentParser(prog="python -m nanoserve.bench.roofline")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, best kept")
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = tuple(sorted(a.rows))
    llm = engine(rows)
    cost = StepCost.of(ModelConfig.from_dict(shape_config("smollm2-135m")), dtype_bytes=4)
    print(f"roofline: SmolLM2-135M shape (random), float32, {cost.weight_bytes / 1e6:.1f} MB of "
          f"weights a step, {PROMPT}-token prompts, best of {a.rounds} interleaved rounds; "
          f"{llm.binding.describe()}; {llm.kernels_reason}")
    print(describe_hardware())
    print(report(Roofline.of(best_rounds(roofline_arms(llm, rows), a.rounds), cost)))


if __name__ == "__main__":
    main()
