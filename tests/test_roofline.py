"""``nanoserve.bench.roofline``'s arithmetic, worked out by hand: a step's bytes and FLOPs from a
config, the floor's two regimes and the ridge where they meet. Nothing here is timed; the
measured rates are stand-ins."""

from __future__ import annotations

import math

import pytest

from nanoserve.bench.roofline import Machine, Roofline, StepCost, floor_s, ridge_rows
from nanoserve.bench.shapes import shape_config
from nanoserve.config import ModelConfig

# 2 layers, hidden 4, intermediate 8, 2 query heads and 1 K/V head of 2, a vocabulary of 10.
TOY = {"model_type": "llama", "vocab_size": 10, "hidden_size": 4, "intermediate_size": 8,
       "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
       "head_dim": 2}


def toy(**changes) -> StepCost:
    return StepCost.of(ModelConfig.from_dict({**TOY, **changes}), dtype_bytes=4)


def test_a_toy_configs_bill_by_hand():
    c = toy()
    # a layer's linears: qkv 4 x (4 + 2 + 2) = 32, o 4 x 4 = 16, gate_up 4 x 16 = 64,
    # down 8 x 4 = 32: 144 weights, and two norms of 4: 152 parameters.
    # Two layers 304, the embedding 40, an untied head 40, the final norm 4: 388.
    assert c.params == 388 and c.weight_bytes == 388 * 4
    # 2 FLOPs per weight of every linear, the head's 40 included: 2 x (2 x 144 + 40)
    assert c.flops_per_row == 656
    # per position: q.k and p.v, 2 FLOPs each over q_size 4, 2 layers; K and V of 2, 4 bytes
    assert c.attn_flops_per_position == 2 * 2 * 2 * 4 == 32
    assert c.kv_bytes_per_position == 2 * 2 * 2 * 4 == 32
    assert c.bytes(3, 5) == 1552 + 3 * 5 * 32 == 2032
    assert c.flops(3, 5) == 3 * (656 + 5 * 32) == 2448
    assert c.intensity(3, 5) == pytest.approx(2448 / 2032)


def test_a_tied_head_is_read_once_and_biases_are_read():
    tied = toy(tie_word_embeddings=True)
    assert tied.params == 388 - 40 and tied.flops_per_row == 656  # the head still multiplies
    # attention biases on q, k, v and o: (4 + 2 + 2 + 4) a layer
    assert toy(attention_bias=True).params == 388 + 2 * 12
    assert toy(mlp_bias=True).params == 388 + 2 * (16 + 4)


def test_smollm2_135m_by_hand():
    c = StepCost.of(ModelConfig.from_dict(shape_config("smollm2-135m")), dtype_bytes=4)
    E, inter, V = 576, 1536, 49152
    linears = E * 960 + E * E + E * 2 * inter + inter * E  # q 576 + k 192 + v 192 = 960
    assert linears == 3_538_944
    assert c.params == 30 * (linears + 2 * E) + V * E + E == 134_515_008  # tied: no head
    assert c.weight_bytes == 538_060_032
    assert c.flops_per_row == 2 * (30 * linears + V * E) == 268_959_744
    assert (c.attn_flops_per_position, c.kv_bytes_per_position) == (69_120, 46_080)
    assert StepCost.of(ModelConfig.from_dict(shape_config("smollm2-135m")),
                       dtype_bytes=2).weight_bytes == 269_030_016


def test_the_floor_is_the_larger_term():
    c = toy()
    bw, peak = 100.0, 200.0  # bytes/s, FLOP/s: a balance of 2 FLOPs per byte
    # 1 row, context 5: 1712 bytes (17.12 s) against 816 FLOPs (4.08 s): reading bounds it
    assert floor_s(c, 1, 5, bw, peak) == pytest.approx(17.12)
    # 20 rows: 4752 bytes (47.52 s) against 16,320 FLOPs (81.6 s): multiplying bounds it
    assert floor_s(c, 20, 5, bw, peak) == pytest.approx(81.6)


def test_the_ridge_is_where_the_terms_meet():
    c = toy()
    # balance 2, context 5: 2 x 1552 / (656 + 5 x (32 - 2 x 32)) = 3104 / 496
    r = ridge_rows(c, 5, 2.0)
    assert r == pytest.approx(3104 / 496)
    assert c.bytes(r, 5) / 100.0 == pytest.approx(c.flops(r, 5) / 200.0)
    # no context: balance x W / F, and twice the balance for float32 weights all in linears
    assert ridge_rows(c, 0, 2.0) == pytest.approx(2 * 1552 / 656)
    # each row's K/V costs more to read than its FLOPs cost to do: never compute-bound
    assert ridge_rows(c, 5, 30.0) == math.inf


def test_rates_and_distances_from_best_seconds():
    best = {"read": 0.5, "matmul torch": 2.0, "matmul onednn": 1.0, "rows 1": 20.0,
            "rows 40": 100.0}
    m = Machine.of(best, read_bytes=100, n=10)  # 2 x 10^3 FLOPs a matmul
    assert (m.bandwidth, m.peak) == (200.0, 2000.0)
    assert m.rates["matmul torch"] == 1000.0 and m.balance == 10.0
    rf = Roofline.of(best, toy(), context=0, read_bytes=100, n=10)
    assert list(rf.steps) == [1, 40]
    assert rf.floor(1) == pytest.approx(1552 / 200.0)  # 7.76 s of reading
    assert rf.distance(1) == pytest.approx(20.0 / 7.76)
    # 40 rows: 40 x 656 FLOPs over 2000 FLOP/s is 13.12 s, past the 7.76 s of reading
    assert rf.bound_by(1) == "memory" and rf.bound_by(40) == "compute"
    assert rf.distance(40) == pytest.approx(100.0 / 13.12)
    assert rf.ridge == pytest.approx(10 * 1552 / 656)
    # a read beside each step arm: the fastest of them is the bandwidth
    assert Machine.of({**best, "read before rows 1": 0.25}, read_bytes=100, n=10).bandwidth \
        == 400.0
    # with context 5, balance 10: 656 + 5 x (32 - 320) < 0, never compute-bound
    assert Roofline.of(best, toy(), context=5, read_bytes=100, n=10).ridge == math.inf
