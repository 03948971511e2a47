"""Day 32's numbers: what a decode step of the SmolLM2-135M shape must read and compute, the floor
that follows, and how far the engine's own steps sit above it.

The exact rows are arithmetic on the config (``nanoserve.bench.roofline.StepCost``), checked
against a second count from the Day 1 model's tensors on the meta device (``snapshot/bill.py``),
and the floor's shape at a named machine balance; they hold on every machine. The timed rows
measure this machine's read rate and float32 matmul rate and the engine's decode steps at 1 to
64 rows, all on one thread pinned to one core, in interleaved rounds (``best_of``), and state
only ratios of things measured in the same run.
"""

from __future__ import annotations

import functools

from chapters.common import best_of, meta_model, one_thread
from chapters.runner import exact, timed
from nanoserve.bench.roofline import (
    PROMPT,
    ROWS,
    Roofline,
    StepCost,
    engine,
    floor_s,
    ridge_rows,
    roofline_arms,
)
from nanoserve.bench.shapes import shape_config
from nanoserve.config import ModelConfig

from .snapshot.bill import step_bill

SHAPE = "smollm2-135m"
BALANCE = 10.0  # FLOPs per byte: a named machine for the exact rows, not a measured one
BALANCES = (5.0, 10.0, 20.0)
ROUNDS = 5


@functools.cache
def cost() -> StepCost:
    return StepCost.of(ModelConfig.from_dict(shape_config(SHAPE)), dtype_bytes=4)


@functools.cache
def counted() -> dict[str, int]:
    """The same bill counted from the Day 1 model's tensors (``snapshot/bill.py``)."""
    return step_bill(meta_model(shape_config(SHAPE)))


def bill_row() -> str:
    c, n = cost(), counted()
    agree = "agree" if (c.params, c.weight_bytes) == (n["params"], n["weight_bytes"]) else "differ"
    return f"{c.params:,} and {c.weight_bytes:,}; the Day 1 model's tensors {agree}"


def flops_row() -> str:
    c = cost()
    agree = "agree" if c.flops_per_row == counted()["flops_per_row"] else "differ"
    return f"{c.flops_per_row:,}; the Day 1 model's linears {agree}"


def attention_row() -> str:
    c = cost()
    return f"{c.attn_flops_per_position:,}, then {c.kv_bytes_per_position:,}"


def intensity_row(context: int = PROMPT) -> str:
    c = cost()
    return f"{c.intensity(1, context):.2f}, then {c.intensity(64, context):.1f}"


def ridges(context: int = PROMPT, balances=BALANCES) -> list[float]:
    return [ridge_rows(cost(), context, b) for b in balances]


def ridge_row() -> str:
    a, b, c = ridges()
    return f"{a:.1f}, {b:.1f} and {c:.1f}"


def floor_ratio(rows: int = 64, context: int = PROMPT, balance: float = BALANCE) -> float:
    """Floor at ``rows`` over floor at 1 row, on a machine of ``balance`` FLOPs per byte (the
    bandwidth cancels: take it as 1 byte/s and the peak as ``balance``)."""
    return (floor_s(cost(), rows, context, 1.0, balance)
            / floor_s(cost(), 1, context, 1.0, balance))


@functools.cache
def llm():
    """The default engine in float32, built on one thread: its team is one thread, pinned."""
    with one_thread():
        return engine(ROWS)


def measure(rows: tuple[int, ...] = ROWS, rounds: int = ROUNDS) -> Roofline:
    """This machine's read and matmul rates and the engine's decode steps at ``rows``, every
    arm in each of ``rounds`` interleaved rounds on one thread (a read beside each step arm),
    each arm's best kept."""
    arms = roofline_arms(llm(), rows)
    return Roofline.of(best_of(rounds, arms, lambda s: s), cost(), context=PROMPT)


@functools.cache
def measured() -> Roofline:
    return measure()


def lowest_distance() -> float:
    rf = measured()
    return min(rf.distance(r) for r in rf.steps)


def tokens_per_s_gain(rf: Roofline | None = None) -> float:
    """Tokens a second at 64 rows over tokens a second at 1 row."""
    rf = rf or measured()
    return (64 / rf.steps[64]) / (1 / rf.steps[1])


CLAIMS = [
    exact("SmolLM2-135M shape: parameters, then bytes a decode step reads in float32 (every "
          "weight once)", bill_row),
    exact("FLOPs per row of a decode step: every linear, the LM head included", flops_row),
    exact("attention per row and per context position, all 30 layers: FLOPs, then K/V bytes "
          "read in float32", attention_row),
    exact("arithmetic intensity at context 8, FLOPs per byte read: 1 row, then 64 rows",
          intensity_row),
    exact("ridge point at context 8, in rows, at machine balances of 5, 10 and 20 FLOPs per "
          "byte", ridge_row),
    exact("floor at 64 rows / floor at 1 row, context 8, balance 10 FLOPs per byte", floor_ratio,
          fmt="{:.2f}x".format),
    timed("lowest measured step / its floor over rows 1, 2, 4, 8, 16, 32 and 64, one thread",
          lowest_distance, fmt="{:.2f}x".format),
    timed("1-row decode step / its floor, one thread", lambda: measured().distance(1),
          fmt="{:.2f}x".format),
    timed("decode tokens per second, 64 rows / 1 row, one thread", tokens_per_s_gain,
          fmt="{:.1f}x".format),
]
