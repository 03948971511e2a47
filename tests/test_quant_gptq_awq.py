"""GPTQ and AWQ checkpoints read into ``QuantizedWeight``: round trips through the fixture
packers (written from each format's description, separately from the readers), hand-built words
whose bits are known, and every refusal.

What the round trips prove is stated in ``nanoserve/quantization/fixtures.py``: reader and writer
agree with each other and with the published description as we read it, exactly, value for
value; not that AutoGPTQ, GPTQModel or AutoAWQ write what we read. The hand-built words pin the
bit positions to the description independently of both functions.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.quantization import awq_format, gptq_format
from nanoserve.quantization.checkpoint import read_quantized
from nanoserve.quantization.fixtures import (
    awq_checkpoint,
    gptq_checkpoint,
    pack_awq,
    pack_gptq,
    random_layer,
    reference_dequantize,
)
from nanoserve.quantization.weight import QuantizedWeight


def gptq_config(bits=4, group_size=64, sym=False, desc_act=False, fmt="gptq", **more) -> dict:
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym,
            "desc_act": desc_act, "checkpoint_format": fmt, **more}


def awq_config(group_size=64, **more) -> dict:
    return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": group_size,
            "zero_point": True, **more}


def prefixed(tensors: dict, layer: str = "model.layers.0.mlp.up_proj") -> dict:
    return {f"{layer}.{k}": v for k, v in tensors.items()}


def gptq_case(N=16, K=256, bits=4, group_size=64, sym=False, desc_act=False, fmt="gptq", seed=0):
    u, z, s, g = random_layer(N, K, bits, group_size, sym=sym, act_order=desc_act,
                              no_zero_zero=fmt == "gptq", seed=seed)
    hf = prefixed(pack_gptq(u, z, s, g, bits, fmt))
    return hf, gptq_config(bits, group_size, sym, desc_act, fmt), reference_dequantize(u, z, s, g)


def awq_case(N=16, K=256, group_size=64, seed=0):
    u, z, s, g = random_layer(N, K, 4, group_size, sym=False, act_order=False, seed=seed)
    return prefixed(pack_awq(u, z, s)), awq_config(group_size), reference_dequantize(u, z, s, g)


LAYER = "model.layers.0.mlp.up_proj"


# ---- round trips -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_round_trip(bits, group_size, sym, desc_act, fmt):
    hf, config, reference = gptq_case(bits=bits, group_size=group_size, sym=sym,
                                      desc_act=desc_act, fmt=fmt)
    bias, norm = torch.randn(16), torch.randn(256)
    hf[f"{LAYER}.bias"], hf["model.norm.weight"] = bias, norm
    out = read_quantized(hf, config)
    assert set(out) == {f"{LAYER}.weight", f"{LAYER}.bias", "model.norm.weight"}
    assert out[f"{LAYER}.bias"] is bias and out["model.norm.weight"] is norm
    qw = out[f"{LAYER}.weight"]
    assert isinstance(qw, QuantizedWeight)
    assert (qw.bits, qw.group_size, qw.symmetric) == (bits, 256 if group_size == -1
                                                      else group_size, sym)
    assert (qw.perm is None) == (not desc_act or group_size == -1)
    w = qw.dequantize(torch.float32)
    assert torch.equal(w, reference)
    # the canonical formula by hand, against dequantize
    q = qw.q.to(torch.float32) - (0 if sym else qw.zero.to(torch.float32).repeat_interleave(
        qw.group_size, 1))
    by_hand = q * qw.scale.to(torch.float32).repeat_interleave(qw.group_size, 1)
    if qw.perm is not None:
        by_hand = by_hand[:, torch.argsort(qw.perm)]
    assert torch.equal(by_hand, w)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_awq_round_trip(group_size):
    hf, config, reference = awq_case(group_size=group_size)
    hf["lm_head.weight"] = head = torch.randn(8, 16)
    out = read_quantized(hf, config)
    assert out["lm_head.weight"] is head
    qw = out[f"{LAYER}.weight"]
    assert (qw.bits, qw.group_size, qw.symmetric, qw.perm) == (
        4, 256 if group_size == -1 else group_size, False, None)
    assert torch.equal(qw.dequantize(), reference)


@settings(max_examples=20, deadline=None)
@given(words=st.integers(1, 6), groups=st.integers(1, 4), gs=st.sampled_from([32, 64, 128]),
       bits=st.sampled_from([4, 8]), sym=st.booleans(), desc_act=st.booleans(),
       fmt=st.sampled_from(["gptq", "gptq_v2"]), seed=st.integers(0, 2**16))
def test_gptq_random_shapes(words, groups, gs, bits, sym, desc_act, fmt, seed):
    N = words * 8 - (3 if words > 1 else 0)  # qzeros' last word part-filled when N % 8
    hf, config, reference = gptq_case(N, groups * gs, bits, gs, sym, desc_act, fmt, seed)
    assert torch.equal(read_quantized(hf, config)[f"{LAYER}.weight"].dequantize(), reference)


@settings(max_examples=15, deadline=None)
@given(words=st.integers(1, 6), groups=st.integers(1, 4), gs=st.sampled_from([32, 64, 128]),
       seed=st.integers(0, 2**16))
def test_awq_random_shapes(words, groups, gs, seed):
    hf, config, reference = awq_case(words * 8, groups * gs, gs, seed)
    assert torch.equal(read_quantized(hf, config)[f"{LAYER}.weight"].dequantize(), reference)


# ---- hand-built words: the bit positions as the descriptions state them -------------------------

def word(x: int) -> int:
    """A 32-bit pattern as the signed int32 it is stored as."""
    return x - (1 << 32) if x >= 1 << 31 else x


def test_gptq_words_by_hand():
    # 4 bits: one word of inputs 0..7 for one output, nibble k (lowest first) = input k
    hf = {"l.qweight": torch.tensor([[word(0xFEDCBA98)], [0x76543210]], dtype=torch.int32),
          "l.qzeros": torch.tensor([[0x00000006]], dtype=torch.int32),  # stored 6 = true 7
          "l.scales": torch.tensor([[0.5]], dtype=torch.float16)}
    qw = gptq_format.read(hf, gptq_config(4, -1))["l.weight"]
    u = [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7]
    assert qw.dequantize().tolist() == [[(v - 7) * 0.5 for v in u]]
    # 8 bits: inputs 0..3 in bytes, lowest first; zeros of outputs 0..3 likewise (gptq_v2)
    hf = {"l.qweight": torch.tensor([[word(0x80FF0102)] * 4], dtype=torch.int32),
          "l.qzeros": torch.tensor([[word(0x807F0100)]], dtype=torch.int32),
          "l.scales": torch.ones(1, 4, dtype=torch.float16)}
    qw = gptq_format.read(hf, gptq_config(8, -1, fmt="gptq_v2"))["l.weight"]
    assert qw.dequantize().T.tolist() == [[2 - z for z in (0, 1, 127, 128)],
                                          [1 - z for z in (0, 1, 127, 128)],
                                          [255 - z for z in (0, 1, 127, 128)],
                                          [128 - z for z in (0, 1, 127, 128)]]


def test_gptq_packer_by_hand():
    u = torch.arange(16).reshape(1, 16) % 16  # one output, inputs 0..15
    t = pack_gptq(u, torch.tensor([[8]]), torch.ones(1, 1), torch.zeros(16, dtype=torch.int32),
                  bits=4, checkpoint_format="gptq")
    assert t["qweight"].tolist() == [[0x76543210], [word(0xFEDCBA98)]]
    assert t["qzeros"].tolist() == [[7]]  # 8 minus one, output 0 in the lowest nibble


def test_awq_interleaving_by_hand():
    # nibbles 0..7 of the word hold output columns 0, 2, 4, 6, 1, 3, 5, 7
    hf = {"l.qweight": torch.tensor([[0x76543210]], dtype=torch.int32),  # nibble i = i
          "l.qzeros": torch.tensor([[0x11111111]], dtype=torch.int32),  # every zero 1
          "l.scales": torch.ones(1, 8, dtype=torch.float16)}
    qw = awq_format.read(hf, awq_config(-1))["l.weight"]
    assert qw.dequantize()[:, 0].tolist() == [v - 1 for v in (0, 4, 1, 5, 2, 6, 3, 7)]
    # and the packer: column c holding value c gives nibbles 0, 2, 4, 6, 1, 3, 5, 7
    t = pack_awq(torch.arange(8).reshape(8, 1), torch.arange(8).reshape(1, 8), torch.ones(1, 8))
    assert t["qweight"].tolist() == [[0x75316420]]
    assert t["qzeros"].tolist() == [[0x75316420]]


def test_whole_checkpoints_round_to_nearest():
    gen = torch.Generator().manual_seed(0)
    dense = {"model.layers.0.self_attn.q_proj.weight": torch.randn(32, 64, generator=gen),
             "model.layers.0.mlp.down_proj.weight": torch.randn(16, 128, generator=gen),
             "model.norm.weight": torch.ones(64), "lm_head.weight": torch.randn(40, 64)}
    for hf, config in (gptq_checkpoint(dense, bits=4, group_size=32, sym=False, desc_act=True),
                       gptq_checkpoint(dense, bits=8, group_size=-1, checkpoint_format="gptq_v2"),
                       awq_checkpoint(dense, group_size=32)):
        out = read_quantized(hf, config)
        assert out["lm_head.weight"] is dense["lm_head.weight"]
        for name in ("model.layers.0.self_attn.q_proj.weight",
                     "model.layers.0.mlp.down_proj.weight"):
            qw = out[name]
            assert (qw.perm is not None) == config.get("desc_act", False)
            err = (qw.dequantize() - dense[name]).abs().max()
            assert err <= 0.6 * float(qw.scale.float().max())  # half a step, and the clamp


# ---- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"bits": 3}, ["bits=3", "[4, 8]"]),
    ({"bits": True}, ["bits=True"]),
    ({"group_size": 0}, ["group_size=0"]),
    ({"group_size": "128"}, ["group_size='128'"]),
    ({"checkpoint_format": "marlin"}, ["checkpoint_format='marlin'", "gptq_v2"]),
    ({"sym": "yes"}, ["sym='yes'"]),
    ({"desc_act": None}, ["desc_act=None"]),
    ({"pack_dtype": "int16"}, ["pack_dtype='int16'", "int32"]),
    ({"dynamic": {"-:.*down_proj": {}}}, ["dynamic"]),
    ({"quant_method": "awq"}, ["quant_method='awq'"]),
])
def test_gptq_refuses_settings(change, words):
    hf, config, _ = gptq_case()
    with pytest.raises(ValueError) as e:
        gptq_format.read(hf, {**config, **change})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_gptq_format_key_is_read_too():
    """Some writers name the packing ``format`` instead of ``checkpoint_format``."""
    hf, config, reference = gptq_case(fmt="gptq_v2")
    del config["checkpoint_format"]
    with pytest.raises(ValueError, match="format='bitblas'"):
        gptq_format.read(hf, {**config, "format": "bitblas"})
    out = gptq_format.read(hf, {**config, "format": "gptq_v2"})
    assert torch.equal(out[f"{LAYER}.weight"].dequantize(), reference)


@pytest.mark.parametrize("corrupt, words", [
    (lambda hf: hf.pop(f"{LAYER}.qzeros"), [f"{LAYER}.qzeros is missing"]),
    (lambda hf: hf.pop(f"{LAYER}.scales"), [f"{LAYER}.scales is missing"]),
    (lambda hf: hf.pop(f"{LAYER}.qweight"), [f"{LAYER}.qweight is missing"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.weight", torch.zeros(16, 256)), ["dense", "(16, 256)"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.qweight", hf[f"{LAYER}.qweight"].float()),
     [f"{LAYER}.qweight", "int32", "float32"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.scales", hf[f"{LAYER}.scales"][:3]),
     [f"{LAYER}.scales", "(3, 16)", "(4, 16)"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.qzeros", hf[f"{LAYER}.qzeros"][:, :1]),
     [f"{LAYER}.qzeros", "(4, 1)", "(4, 2)"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.qweight", hf[f"{LAYER}.qweight"][:30]),
     [f"{LAYER}.qweight", "(30, 16)", "240 inputs", "group_size 64"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.g_idx", hf[f"{LAYER}.g_idx"][:200]),
     [f"{LAYER}.g_idx", "(200,)", "(256,)"]),
    (lambda hf: hf[f"{LAYER}.g_idx"].__setitem__(0, 4), [f"{LAYER}.g_idx", "0..3"]),
])
def test_gptq_refuses_corrupt_tensors(corrupt, words):
    hf, config, _ = gptq_case(desc_act=True)
    corrupt(hf)
    with pytest.raises(ValueError) as e:
        gptq_format.read(hf, config)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_gptq_refuses_inconsistent_zeros_and_groups():
    hf, config, _ = gptq_case(fmt="gptq_v2")  # asymmetric zeros
    with pytest.raises(ValueError, match=f"{LAYER}.qzeros: sym is true"):
        gptq_format.read(hf, {**config, "sym": True})
    # a v1 zero stored as 15 (true 16): the underflow of a true zero of 0
    hf, config, _ = gptq_case()
    hf[f"{LAYER}.qzeros"][0, 0] = 0x0000000F
    with pytest.raises(ValueError, match=f"{LAYER}.qzeros stores a zero point of 15"):
        gptq_format.read(hf, config)
    # act order: uneven groups, or a shuffled g_idx with desc_act false, or no g_idx at all
    hf, config, _ = gptq_case(desc_act=True)
    g = hf[f"{LAYER}.g_idx"]
    g[g == 1] = 0
    with pytest.raises(ValueError, match=f"{LAYER}.g_idx puts 128 inputs in group 0"):
        gptq_format.read(hf, config)
    hf, config, _ = gptq_case(desc_act=True)
    with pytest.raises(ValueError, match=f"{LAYER}.g_idx .*desc_act is false"):
        gptq_format.read(hf, {**config, "desc_act": False})
    hf.pop(f"{LAYER}.g_idx")
    with pytest.raises(ValueError, match=f"{LAYER}.g_idx is missing"):
        gptq_format.read(hf, config)
    hf, config, reference = gptq_case()  # without desc_act, g_idx may be left out
    hf.pop(f"{LAYER}.g_idx")
    assert torch.equal(gptq_format.read(hf, config)[f"{LAYER}.weight"].dequantize(), reference)


def test_fixture_writers_refuse_what_the_format_cannot_hold():
    u = torch.zeros(8, 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="gptq zero points"):
        pack_gptq(u, torch.zeros(1, 8), torch.ones(1, 8), torch.zeros(8), 4, "gptq")
    with pytest.raises(ValueError, match="u: values 0..16"):
        pack_gptq(u + torch.eye(8, dtype=torch.int64) * 16, torch.ones(1, 8), torch.ones(1, 8),
                  torch.zeros(8), 4)


@pytest.mark.parametrize("change, words", [
    ({"version": "gemv"}, ["version='gemv'", "gemm"]),
    ({"version": "marlin"}, ["version='marlin'"]),
    ({"version": "exllama"}, ["version='exllama'"]),
    ({"zero_point": False}, ["zero_point=False", "[True]"]),
    ({"bits": 8}, ["bits=8", "[4]"]),
    ({"backend": "llm-awq"}, ["backend='llm-awq'"]),
    ({"group_size": -3}, ["group_size=-3"]),
    ({"modules_to_not_convert": "lm_head"}, ["modules_to_not_convert='lm_head'"]),
    ({"modules_to_not_convert": ["up_proj"]}, [LAYER, "modules_to_not_convert", "'up_proj'"]),
    ({"quant_method": "gptq"}, ["quant_method='gptq'"]),
])
def test_awq_refuses_settings(change, words):
    hf, config, _ = awq_case()
    with pytest.raises(ValueError) as e:
        awq_format.read(hf, {**config, **change})
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("corrupt, words", [
    (lambda hf: hf.pop(f"{LAYER}.scales"), [f"{LAYER}.scales is missing"]),
    (lambda hf: hf.pop(f"{LAYER}.qweight"), [f"{LAYER}.qweight is missing"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.scales", hf[f"{LAYER}.scales"][:, :8]),
     [f"{LAYER}.scales", "(4, 8)", "(4, 16)"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.qzeros", hf[f"{LAYER}.qzeros"][:2]),
     [f"{LAYER}.qzeros", "(2, 2)", "(4, 2)"]),
    (lambda hf: hf.__setitem__(f"{LAYER}.qweight", hf[f"{LAYER}.qweight"][:100]),
     [f"{LAYER}.qweight", "(100, 2)", "100 inputs", "group_size 64"]),
])
def test_awq_refuses_corrupt_tensors(corrupt, words):
    hf, config, _ = awq_case()
    corrupt(hf)
    with pytest.raises(ValueError) as e:
        awq_format.read(hf, config)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_awq_leaves_unconverted_modules_dense():
    hf, config, reference = awq_case()
    hf["lm_head.weight"] = head = torch.randn(4, 16)
    out = awq_format.read(hf, {**config, "modules_to_not_convert": ["lm_head"]})
    assert out["lm_head.weight"] is head
    assert torch.equal(out[f"{LAYER}.weight"].dequantize(), reference)
