"""compressed-tensors checkpoints, read as the library that defines the format writes them.

Each case quantizes a random weight with the library's own compressor (its ``quantize`` and
packing, from our scale and zero point) and checks that nanoserve's reader gives back integers
whose dequantized weight equals, to the bit, what the library's decompressor gives from the same
tensors; and the other way round, that the library decompresses what nanoserve's writer wrote.
Then every malformed config and tensor is refused with a message that names it.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.naive_quantized import (  # noqa: E402
    NaiveQuantizationCompressor,
)
from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationScheme  # noqa: E402

from nanoserve.quantization.checkpoint import read_quantized  # noqa: E402
from nanoserve.quantization.compressed_tensors_write import (  # noqa: E402
    layer_tensors,
    quantization_config,
)
from nanoserve.quantization.rtn import quantize_rtn  # noqa: E402
from nanoserve.quantization.weight import QuantizedWeight  # noqa: E402

LAYER = "model.layers.0.mlp.down_proj"
CASES = [(bits, gs, sym) for bits in (4, 8) for gs in (32, 64, 128, None) for sym in (True, False)]


def _config(bits, gs, sym, act=False):
    name = "w8a8" if act else {4: "w4a16", 8: "w8a16"}[bits]
    return quantization_config(name, gs, sym, ["lm_head"])


def _scheme(qc):
    return QuantizationScheme.model_validate(qc["config_groups"]["group_0"])


def _library_pack(w, qw, qc):
    """The library's own compressor applied to ``w`` with our scale and zero point."""
    state = {"weight": w, "weight_scale": qw.scale}
    if qw.zero is not None:
        state["weight_zero_point"] = qw.zero
    compressor = PackedQuantizationCompressor if qc["format"] == "pack-quantized" \
        else NaiveQuantizationCompressor
    packed = compressor.compress(state, _scheme(qc))
    return {f"{LAYER}.{k}": v for k, v in packed.items()}, compressor


@pytest.mark.parametrize("bits,gs,sym", CASES)
def test_reads_what_the_library_writes(bits, gs, sym):
    g = torch.Generator().manual_seed(bits * 1000 + (gs or 0) + sym)
    w = torch.randn(40, 256, generator=g, dtype=torch.float32)
    w[3, 7] = 9.0  # an outlier, so groups differ in scale
    qw = quantize_rtn(w, bits, gs, sym)
    qc = _config(bits, gs, sym)
    stored, compressor = _library_pack(w, qw, qc)
    ours = read_quantized(dict(stored), qc)[f"{LAYER}.weight"]
    assert isinstance(ours, QuantizedWeight)
    assert torch.equal(ours.q, qw.q)  # the library rounded as rtn.py does
    local = {k.removeprefix(LAYER + "."): v for k, v in stored.items()}
    theirs = compressor.decompress(local, _scheme(qc))["weight"]
    assert torch.equal(ours.dequantize(torch.float32), theirs.to(torch.float32))


@pytest.mark.parametrize("bits,gs,sym", CASES[::3])
def test_library_reads_what_nanoserve_writes(bits, gs, sym):
    w = torch.randn(24, 128, generator=torch.Generator().manual_seed(bits), dtype=torch.bfloat16)
    qw = quantize_rtn(w, bits, gs, sym)
    qc = _config(bits, gs, sym)
    stored = {k.removeprefix(LAYER + "."): v for k, v in layer_tensors(LAYER, qw).items()}
    theirs = PackedQuantizationCompressor.decompress(stored, _scheme(qc))["weight"]
    # the library multiplies in the scale's dtype: each product rounded once to bfloat16
    assert theirs.dtype == torch.bfloat16
    assert torch.equal(qw.dequantize(torch.bfloat16), theirs)


def test_w8a8_int_quantized_round_trip():
    w = torch.randn(32, 96, generator=torch.Generator().manual_seed(3))
    qw = quantize_rtn(w, 8, None, True)
    qc = _config(8, None, True, act=True)
    assert qc["format"] == "int-quantized"
    stored, compressor = _library_pack(w, qw, qc)
    assert stored[f"{LAYER}.weight"].dtype == torch.int8
    ours = read_quantized(dict(stored), qc)[f"{LAYER}.weight"]
    assert ours.act_bits == 8 and ours.group_size == 96
    local = {k.removeprefix(LAYER + "."): v for k, v in stored.items()}
    theirs = compressor.decompress(local, _scheme(qc))["weight"]
    assert torch.equal(ours.dequantize(), theirs.to(torch.float32))


def test_dense_tensors_pass_through_and_ignored_layers_stay_dense():
    w = torch.randn(16, 64)
    qc = _config(4, 32, True)
    hf = {**layer_tensors(LAYER, quantize_rtn(w, 4, 32)), "lm_head.weight": w,
          "model.norm.weight": torch.ones(64)}
    out = read_quantized(hf, qc)
    assert set(out) == {f"{LAYER}.weight", "lm_head.weight", "model.norm.weight"}
    assert out["lm_head.weight"] is w
    hf["lm_head.weight_scale"] = torch.ones(16, 2)  # the ignored head stored quantized
    with pytest.raises(ValueError, match="lm_head: quantization_config.ignore names it"):
        read_quantized(hf, qc)


def _mutate(qc, path, value):
    qc = {**qc, "config_groups": {"group_0": dict(qc["config_groups"]["group_0"])}}
    group = qc["config_groups"]["group_0"]
    if path[0] == "weights":
        group["weights"] = {**group["weights"], path[1]: value}
    else:
        group[path[0]] = value
    return qc


@pytest.mark.parametrize("path,value,message", [
    (("weights", "type"), "float", r"weights.type='float' is not supported"),
    (("weights", "num_bits"), 3, r"weights.num_bits=3 is not supported; nanoserve reads \(4, 8\)"),
    (("weights", "strategy"), "tensor", r"weights.strategy='tensor'"),
    (("weights", "strategy"), "block", r"weights.strategy='block'"),
    (("weights", "actorder"), "group", r"weights.actorder='group'"),
    (("input_activations",), {"num_bits": 8, "type": "int", "strategy": "tensor",
                              "dynamic": False, "symmetric": True}, "input_activations="),
    (("input_activations",), {"num_bits": 8, "type": "float", "strategy": "token",
                              "dynamic": True}, "input_activations="),
    (("format",), "float-quantized", r"format='float-quantized'"),
])
def test_unsupported_schemes_are_refused_by_key(path, value, message):
    qc = _mutate(_config(4, 32, True), path, value)
    hf = layer_tensors(LAYER, quantize_rtn(torch.randn(8, 64), 4, 32))
    with pytest.raises(ValueError, match=message):
        read_quantized(hf, qc)


def test_other_methods_and_states_are_refused():
    hf = layer_tensors(LAYER, quantize_rtn(torch.randn(8, 64), 4, 32))
    with pytest.raises(ValueError, match="quant_method='fp8' is not supported; nanoserve reads "
                                         "compressed-tensors, gptq, awq"):
        read_quantized(hf, {"quant_method": "fp8"})
    qc = _config(4, 32, True)
    with pytest.raises(ValueError, match="quantization_status='frozen'"):
        read_quantized(hf, {**qc, "quantization_status": "frozen"})
    with pytest.raises(ValueError, match="sparsity_config"):
        read_quantized(hf, {**qc, "sparsity_config": {"format": "sparse-24"}})


def _corrupt(name, tensor, qc=None, sym=True):
    qw = quantize_rtn(torch.randn(16, 64, generator=torch.Generator().manual_seed(1)), 4, 32,
                      sym)
    hf = layer_tensors(LAYER, qw)
    hf[f"{LAYER}.{name}"] = tensor
    return hf, qc or _config(4, 32, sym)


@pytest.mark.parametrize("name,tensor,message", [
    ("weight_scale", torch.ones(16, 3), r"down_proj.weight_scale has shape \(16, 3\); a "
                                        r"\(16, 64\) weight in groups of 32 needs \(16, 2\)"),
    ("weight_packed", torch.zeros(16, 7, dtype=torch.int32),
     r"weight_packed has shape \(16, 7\) torch.int32; weight_shape \[16, 64\] at 4 bits "
     r"needs int32 \(16, 8\)"),
    ("weight_shape", torch.tensor([16, 60]), r"group_size 32 does not divide the 60 inputs"),
])
def test_corrupt_tensors_name_the_tensor_and_shapes(name, tensor, message):
    hf, qc = _corrupt(name, tensor)
    if name == "weight_shape":  # a matching packed width, so the group check speaks
        hf[f"{LAYER}.weight_packed"] = torch.zeros(16, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        read_quantized(hf, qc)


def test_corrupt_zero_points_and_missing_tensors():
    hf, qc = _corrupt("weight_zero_point", torch.zeros(1, 5, dtype=torch.int32), sym=False)
    with pytest.raises(ValueError, match=r"weight_zero_point has shape \(1, 5\)"):
        read_quantized(hf, qc)
    hf, qc = _corrupt("weight_zero_point", torch.zeros(2, 2, dtype=torch.int32), sym=False)
    del hf[f"{LAYER}.weight_packed"]
    with pytest.raises(ValueError, match=r"missing tensor '.*down_proj.weight_packed'"):
        read_quantized(hf, qc)
