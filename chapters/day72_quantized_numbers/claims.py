"""Day 72's numbers: what a quantized weight costs in bytes, and what it costs in error.

Bytes are read off ``QuantizedWeight.nbytes`` for weights of a published shape (SmolLM2-135M,
``nanoserve.bench.shapes``), quantized with bfloat16 scales as a bf16 checkpoint stores them; the
byte ceiling is the bf16 model's bytes per decode token over the quantized model's, the tied
head left in bf16. Errors are measured on the shipped nanoserve-tiny's own float32 weights (its
28 linear layers) through ``nanoserve.quantization.rtn``, and on the activations that enter
those layers when transformers runs the model over 256 tokens of the first held-out topic. The
packed tensors are checked against compressed-tensors, the library that defines the format.
Nothing here reads a clock.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from chapters.common import SHIPPED
from chapters.runner import bound, exact

from .snapshot.grid import quantize_group

GROUPS = (16, 32, 64, 128, None)  # None: one scale per output feature ("per channel")
TOKENS = 256
SCHEMES = {  # what the byte rows and the writer check use: (scheme, bits, group, symmetric)
    "w8a16 group 32": ("w8a16", 8, 32, True),
    "w4a16 group 32": ("w4a16", 4, 32, True),
    "w4a16 group 128": ("w4a16", 4, 128, True),
    "w4a16 per channel": ("w4a16", 4, None, True),
    "w4a16 group 32 asymmetric": ("w4a16", 4, 32, False),
    "w4a16 group 128 asymmetric": ("w4a16", 4, 128, False),
    "w8a8": ("w8a8", 8, None, True),
}


# ------------------------------------------------------------------------------ bytes

@functools.cache
def weight_bytes(name: str, shape: tuple[int, int] = (576, 1536)) -> int:
    """``QuantizedWeight.nbytes`` of a bf16 weight of ``shape`` quantized as ``name``."""
    from nanoserve.quantization.rtn import quantize_rtn

    if name == "bf16":
        return 2 * shape[0] * shape[1]
    _, bits, gs, sym = SCHEMES[name]
    return quantize_rtn(torch.zeros(shape, dtype=torch.bfloat16), bits, gs, sym).nbytes()


def bytes_per_weight(name: str) -> float:
    """Per weight of SmolLM2-135M's down_proj, (576, 1536): 1536 inputs take every group."""
    return weight_bytes(name) / (576 * 1536)


def group_128_fits() -> str:
    """SmolLM2-135M's linears whose inputs groups of 128 divide (576 is 4.5 groups)."""
    shapes = smollm2_linears()
    return f"{sum(k % 128 == 0 for _, k in shapes)} of {len(shapes)}"


def smollm2_linears() -> list[tuple[int, int]]:
    """Every quantized linear's (N, K) in SmolLM2-135M, layer by layer."""
    from nanoserve.bench.shapes import SMOLLM2_135M as c

    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]
    return layer * c["num_hidden_layers"]


def smollm2_bf16_rest() -> int:
    """Bytes a decode token reads besides the linears, always bf16: the tied head (the
    embedding matrix read whole) and the norms (two a layer and the final one)."""
    from nanoserve.bench.shapes import SMOLLM2_135M as c

    h = c["hidden_size"]
    return 2 * (c["vocab_size"] * h + (2 * c["num_hidden_layers"] + 1) * h)


@functools.cache
def decode_bytes(name: str) -> int:
    """Bytes of weights one decode token reads, SmolLM2-135M, the head in bf16."""
    linear = sum(weight_bytes(name, s) for s in smollm2_linears())
    return linear + smollm2_bf16_rest()


def ceiling(name: str) -> float:
    return decode_bytes("bf16") / decode_bytes(name)


def head_share(name: str) -> float:
    from nanoserve.bench.shapes import SMOLLM2_135M as c

    return 2 * c["vocab_size"] * c["hidden_size"] / decode_bytes(name)


# ------------------------------------------------------------------------------ error

@functools.cache
def weights() -> dict[str, torch.Tensor]:
    """nanoserve-tiny's 28 linear weights, float32, by name."""
    from safetensors.torch import load_file

    sd = load_file(SHIPPED / "model.safetensors")
    return {k.removesuffix(".weight"): v for k, v in sd.items()
            if v.dim() == 2 and "embed" not in k}


def sweepable() -> dict[str, torch.Tensor]:
    """The 24 layers with 256 inputs, which every group size of the sweep divides; down_proj's
    688 inputs (16 x 43) take groups of 16 or one per row only."""
    return {k: w for k, w in weights().items() if w.shape[1] == 256}


def relative_mse(bits: int, group: int | None, symmetric: bool) -> float:
    """Squared rounding error over squared weights, summed over the sweepable layers."""
    from nanoserve.quantization.rtn import quantize_rtn

    err = sq = 0.0
    for w in sweepable().values():
        d = w.double() - quantize_rtn(w, bits, group, symmetric).dequantize(torch.float64)
        err, sq = err + d.pow(2).sum().item(), sq + w.double().pow(2).sum().item()
    return err / sq


def mse_row(bits: int, symmetric: bool) -> str:
    return ", ".join(f"{relative_mse(bits, g, symmetric):.2%}" for g in GROUPS)


def mse_ratio_4_to_8() -> str:
    return f"{relative_mse(4, 32, True) / relative_mse(8, 32, True):.0f}"


@functools.cache
def worst_steps() -> float:
    """The largest |w - dequantized w| over one step (the group's scale), every layer of the
    shipped model, 4 and 8 bits, every group size that divides it, both kinds of scale."""
    from nanoserve.quantization.rtn import quantize_rtn

    worst = 0.0
    for w in weights().values():
        for bits in (4, 8):
            for g in (*GROUPS, 688):
                if g is not None and w.shape[1] % g:
                    continue
                for sym in (True, False):
                    qw = quantize_rtn(w, bits, g, sym)
                    d = (w.double() - qw.dequantize(torch.float64)).abs()
                    step = qw.scale.double().repeat_interleave(qw.group_size, 1)
                    worst = max(worst, (d / step).max().item())
    return worst


def divisor_errors(divisor: float) -> tuple[float, float]:
    """4-bit group 32 symmetric with scale max|w| / ``divisor``: the largest error in steps and
    the relative squared error, over the sweepable layers (the frozen grid does the rounding)."""
    worst = err = sq = 0.0
    for w in sweepable().values():
        groups = w.double().reshape(-1, 32)
        deq, scale = quantize_group(groups, 4, divisor=divisor)
        d = (groups - deq).abs()
        worst = max(worst, (d / scale).max().item())
        err, sq = err + d.pow(2).sum().item(), sq + groups.pow(2).sum().item()
    return worst, err / sq


def divisor_row() -> str:
    return ", ".join(f"{divisor_errors(d)[1]:.2%}" for d in (7, 7.5, 8))


@functools.cache
def outlier_growth() -> dict:
    """Layer 0's q_proj with the weight of input 5 in every row set to 8x that row's largest:
    how much the other weights' squared error grows, per channel and in groups of 32."""
    from nanoserve.quantization.rtn import quantize_rtn

    w = weights()["model.layers.0.self_attn.q_proj"]
    spiked = w.clone()
    spiked[:, 5] = 8 * w.abs().amax(1)
    others = torch.ones_like(w, dtype=torch.bool)
    others[:, 5] = False

    def err(x, g):
        return (x - quantize_rtn(x, 4, g, True).dequantize()).pow(2)[others].mean().item()

    return {g: err(spiked, g) / err(w, g) for g in (None, 32)}


# ------------------------------------------------------------------------------ storage

def round_trips() -> str:
    """Every layer's 4- and 8-bit integers (group 16) and asymmetric zero points, packed into
    int32 words and unpacked again."""
    from nanoserve.quantization.packing import pack_int32, unpack_int32
    from nanoserve.quantization.rtn import quantize_rtn

    same = total = 0
    for w in weights().values():
        for bits in (4, 8):
            qw = quantize_rtn(w, bits, 16, False)
            total += 2
            same += torch.equal(unpack_int32(pack_int32(qw.q, bits), bits, qw.shape[1]), qw.q)
            same += torch.equal(unpack_int32(pack_int32(qw.zero, bits, 0), bits,
                                             qw.shape[0], 0), qw.zero)
    return f"{same} of {total}"


def packed_shape() -> str:
    from nanoserve.quantization.compressed_tensors_write import layer_tensors
    from nanoserve.quantization.rtn import quantize_rtn

    qw = quantize_rtn(weights()["model.layers.0.mlp.down_proj"], 4, 16, False)
    t = layer_tensors("down_proj", qw)
    return ", ".join(f"{k.split('.')[-1]} {tuple(v.shape)}" for k, v in t.items())


def library_scheme(cfg: dict):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    group = cfg["config_groups"]["group_0"]
    acts = group["input_activations"]
    return QuantizationScheme(targets=group["targets"],
                              weights=QuantizationArgs(**group["weights"]),
                              input_activations=None if acts is None else QuantizationArgs(**acts))


@functools.cache
def library_agrees() -> str:
    """Each layer written by ``layer_tensors`` and decompressed by compressed-tensors' own
    compressor for the format the ``quantization_config`` names, against ``dequantize``."""
    from compressed_tensors.compressors import BaseCompressor

    from nanoserve.quantization.compressed_tensors_write import (
        layer_tensors,
        quantization_config,
    )
    from nanoserve.quantization.rtn import quantize_rtn

    same = total = 0
    for scheme, bits, g, sym in SCHEMES.values():
        cfg = quantization_config(scheme, g, sym, ["lm_head"])
        library = BaseCompressor.get_value_from_registry(cfg["format"])
        args = library_scheme(cfg)
        for name, w in weights().items():
            if g is not None and w.shape[1] % g:
                continue
            qw = quantize_rtn(w, bits, g, sym)
            if scheme == "w8a8":
                qw = replace(qw, act_bits=8)
            stored = {k.removeprefix(name + "."): v for k, v in layer_tensors(name, qw).items()}
            back = library.decompress(stored, args)["weight"]
            total += 1
            same += torch.equal(back, qw.dequantize(back.dtype))
    return f"{same} of {total}"


# ------------------------------------------------------------------------------ W8A8

@functools.cache
def activations() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(T, K) input of every linear and its weight, transformers running nanoserve-tiny in
    float32 over the first 256 tokens of the first held-out topic."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from tools.train_tiny import corpus

    model = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32)
    ids = Tokenizer.from_file(str(SHIPPED / "tokenizer.json")).encode(corpus()[1][0]).ids
    seen, hooks = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            hooks.append(mod.register_forward_pre_hook(
                lambda m, a, name=name: seen.__setitem__(name, (a[0][0].detach(), m.weight))))
    with torch.no_grad():
        model(torch.tensor([ids[:TOKENS]]))
    for h in hooks:
        h.remove()
    return {k: (x, w.detach()) for k, (x, w) in seen.items()}


@functools.cache
def token_errors() -> dict:
    from nanoserve.quantization.rtn import quantize_per_token, quantize_rtn

    worst, rel, out8, out16 = 0.0, [], [], []
    for x, w in activations().values():
        q, s = quantize_per_token(x)
        xh = q.float() * s
        worst = max(worst, ((x - xh).abs() / s).max().item())
        rel.append((x - xh).pow(2).mean(-1).sqrt() / x.pow(2).mean(-1).sqrt())
        wh = quantize_rtn(w, 8, None, True).dequantize()
        y = x @ w.T
        out8.append(((xh @ wh.T - y).norm() / y.norm()).item())
        out16.append(((x @ wh.T - y).norm() / y.norm()).item())
    rel = torch.cat(rel)
    return {"worst": worst, "median": rel.median().item(), "max": rel.max().item(),
            "tokens": rel.numel(), "w8a8": max(out8), "w8a16": max(out16)}


CLAIMS = [
    exact("bytes per weight, w8a16 group 32, bf16 scales",
          lambda: f"{bytes_per_weight('w8a16 group 32'):g}"),
    exact("bytes per weight, w4a16 group 32, bf16 scales",
          lambda: f"{bytes_per_weight('w4a16 group 32'):g}"),
    exact("bytes per weight, w4a16 group 128, bf16 scales",
          lambda: f"{bytes_per_weight('w4a16 group 128'):g}"),
    exact("bytes per weight, w4a16 per channel, 1,536 inputs, bf16 scales",
          lambda: f"{bytes_per_weight('w4a16 per channel'):.4f}"),
    exact("bytes per weight, w4a16 group 32 asymmetric (a 4-bit zero per group)",
          lambda: f"{bytes_per_weight('w4a16 group 32 asymmetric'):g}"),
    exact("weight bytes one decode token reads, SmolLM2-135M shape, bf16",
          lambda: f"{decode_bytes('bf16') / 1e6:.1f} MB"),
    exact("byte ceiling against bf16, SmolLM2-135M, w8a16 group 32, bf16 head",
          lambda: f"{ceiling('w8a16 group 32'):.2f}x"),
    exact("byte ceiling against bf16, SmolLM2-135M, w4a16 group 32, bf16 head",
          lambda: f"{ceiling('w4a16 group 32'):.2f}x"),
    exact("SmolLM2-135M linears whose inputs groups of 128 divide", group_128_fits),
    exact("share of a w4a16 group 32 decode token's bytes read by the bf16 head",
          lambda: f"{head_share('w4a16 group 32'):.0%}"),
    bound("largest rounding error in steps, every weight of nanoserve-tiny, 4 and 8 bits, "
          "every group size, symmetric and asymmetric", worst_steps, fmt="{:.7f}".format),
    exact("relative squared error, 4-bit symmetric, groups 16, 32, 64, 128, per channel",
          lambda: mse_row(4, True)),
    exact("relative squared error, 4-bit asymmetric, groups 16, 32, 64, 128, per channel",
          lambda: mse_row(4, False)),
    exact("squared error, 4-bit / 8-bit, group 32 symmetric", mse_ratio_4_to_8),
    exact("relative squared error, 4-bit group 32, scale = largest magnitude / 7, / 7.5, / 8",
          divisor_row),
    exact("largest rounding error in steps, 4-bit group 32, scale = largest magnitude / 8",
          lambda: f"{divisor_errors(8)[0]:.2f}"),
    exact("the other weights' squared error with one weight a row at 8x the row's largest, "
          "growth, per channel", lambda: f"{outlier_growth()[None]:.0f}x"),
    exact("the other weights' squared error with one weight a row at 8x the row's largest, "
          "growth, group 32", lambda: f"{outlier_growth()[32]:.0f}x"),
    exact("integers and zero points of all 28 layers, 4 and 8 bits, packed and unpacked unchanged",
          round_trips),
    exact("what compressed_tensors_write stores for down_proj, 4-bit asymmetric, group 16",
          packed_shape),
    exact("layers compressed-tensors decompresses to exactly QuantizedWeight.dequantize, "
          "seven schemes", library_agrees),
    bound("largest activation rounding error in steps, W8A8 per token, 256 tokens into every "
          "linear", lambda: token_errors()["worst"], fmt="{:.7f}".format),
    exact("activation rounding error relative to the token, W8A8, median over 7,168 "
          "token-inputs", lambda: f"{token_errors()['median']:.2%}"),
    exact("activation rounding error relative to the token, W8A8, worst token-input",
          lambda: f"{token_errors()['max']:.1%}"),
    exact("largest relative output error of a layer, int8 weights per channel, float inputs",
          lambda: f"{token_errors()['w8a16']:.2%}"),
    exact("largest relative output error of a layer, int8 weights per channel, int8 inputs "
          "per token", lambda: f"{token_errors()['w8a8']:.2%}"),
]
