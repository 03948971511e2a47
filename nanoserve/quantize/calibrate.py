"""Quantizing a model's decoder layers in order, each against the inputs the quantized layers
before it produce: the calibration loop GPTQ needs (and the plain loop RTN needs).

Why this module exists: GPTQ rounds a linear against the Hessian of its inputs, ``H = 2 X^T X /
n`` over the calibration tokens, and those inputs should be the ones the layer will see at run
time, after the earlier layers were quantized. So the loop goes one decoder layer (block) at a
time: run the calibration batch through the block with a forward hook on each ``Linear``
accumulating ``X^T X`` of its input (a fused ``qkv_proj`` or ``gate_up_proj`` is one linear with
one input, so one Hessian each), quantize the block's linears, put their dequantized weights in
place, and run the block again to give the next block its inputs.

Whatever the family, a block is called as the model calls it: one dense forward of each batch
records every block's arguments (a forward pre-hook), of which only the hidden states change
as the blocks are quantized. The model's ``lm_head`` is never quantized here.

On return the model's linears hold the dequantized weights: the weight-only reference model.

    windows = calibration_windows(tokenizer, text, num_samples=128, seq_len=512)  # (S, L)
    quantized = quantize_model(model, Recipe("w4a16", method="gptq"), windows)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from nanoserve.layers.linear import Linear
from nanoserve.quantization.weight import QuantizedWeight
from nanoserve.quantize.recipe import Recipe

log = logging.getLogger("nanoserve")

# observe(name, dense weight (N, K), Hessian (K, K) or None, quantized): after each linear
Observer = Callable[[str, torch.Tensor, torch.Tensor | None, QuantizedWeight], None]


def calibration_windows(tokenizer, text: str, num_samples: int, seq_len: int) -> torch.Tensor:
    """``num_samples`` windows of ``seq_len`` tokens (S, L) from ``text``, encoded as one
    stream, their starts evenly spread over it (overlapping only where the text is short)."""
    if num_samples < 1 or seq_len < 1:
        raise ValueError(f"calibration: num_samples {num_samples} and seq_len {seq_len} must "
                         f"be at least 1")
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    if len(ids) < seq_len:
        raise ValueError(f"calibration text is {len(ids)} tokens, shorter than one window of "
                         f"seq_len {seq_len}")
    starts = torch.linspace(0, len(ids) - seq_len, num_samples).round().long()
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])


def linears(block: torch.nn.Module, prefix: str) -> dict[str, Linear]:
    """The block's ``Linear`` layers by their nanoserve names (``layers.0.self_attn.qkv_proj``)."""
    return {f"{prefix}.{n}": m for n, m in block.named_modules() if isinstance(m, Linear)}


def quantizable(model: torch.nn.Module, recipe: Recipe) -> tuple[dict[str, Linear], list[str]]:
    """Every decoder-layer linear the recipe quantizes, and the names of those it leaves dense
    (the group size does not divide their inputs)."""
    keep, skipped = {}, []
    for i, block in enumerate(model.layers):
        for name, lin in linears(block, f"layers.{i}").items():
            if recipe.skips(lin.in_features):
                skipped.append(name)
            else:
                keep[name] = lin
    return keep, skipped


@torch.no_grad()
def quantize_model(model: torch.nn.Module, recipe: Recipe,
                   calibration: torch.Tensor | None = None, batch: int = 8,
                   observe: Observer | None = None) -> dict[str, QuantizedWeight]:
    """Quantize every decoder-layer linear of ``model`` that ``recipe`` does not skip, by its
    nanoserve name; ``calibration`` (S, L) token ids, required for GPTQ. ``observe`` sees each
    linear's dense weight, Hessian and result (``quality.layer_errors`` uses it)."""
    targets, _ = quantizable(model, recipe)
    if calibration is None:
        if recipe.needs_calibration:
            raise ValueError(f"{recipe.method} needs calibration tokens (--calibration FILE)")
        out = {}
        for name, lin in targets.items():
            out[name] = _replace(lin, recipe.quantize(lin.weight), name, None, observe)
        return out
    if calibration.dim() != 2:
        raise ValueError(f"calibration ids must be (samples, seq_len), got "
                         f"{tuple(calibration.shape)}")
    chunks = [_block_arguments(model, calibration[i:i + batch])
              for i in range(0, len(calibration), batch)]  # [hidden, [(rest, kwargs)]]
    out = {}
    for i, block in enumerate(model.layers):
        mine = {n: lin for n, lin in linears(block, f"layers.{i}").items() if n in targets}
        sums, hooks = {}, []
        for name, lin in mine.items():
            hooks.append(lin.register_forward_hook(_accumulate(sums, name)))
        try:
            for hidden, rest in chunks:
                block(hidden, *rest[i][0], **rest[i][1])
        finally:
            for h in hooks:
                h.remove()
        for name, lin in mine.items():
            xtx, n = sums[name]
            H = 2 * xtx / n  # (K, K) float64
            out[name] = _replace(lin, recipe.quantize(lin.weight, H), name, H, observe)
        for chunk in chunks:  # the next block reads this block's quantized output
            hidden, rest = chunk
            chunk[0] = block(hidden, *rest[i][0], **rest[i][1])
        log.info("quantized block %d: %s", i, ", ".join(mine))
    return out


def _replace(lin: Linear, qw: QuantizedWeight, name: str, H, observe) -> QuantizedWeight:
    if observe is not None:
        observe(name, lin.weight.detach(), H, qw)
    lin.weight.data.copy_(qw.dequantize(lin.weight.dtype))
    return qw


def _accumulate(sums: dict, name: str):
    def hook(module, inputs, output):
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).to(torch.float64)  # (n, K)
        xtx, n = sums.get(name, (0, 0))
        sums[name] = (xtx + x.T @ x, n + x.shape[0])
    return hook


def _block_arguments(model: torch.nn.Module, ids: torch.Tensor) -> list:
    """One dense forward of ``ids`` (B, L): the first block's hidden states, and each block's
    other arguments (args after the hidden states, kwargs), which quantizing does not change."""
    hidden, rest = [], []

    def record(module, args, kwargs):
        if not hidden:
            hidden.append(args[0])
        rest.append((args[1:], dict(kwargs)))

    hooks = [b.register_forward_pre_hook(record, with_kwargs=True) for b in model.layers]
    try:
        positions = torch.arange(ids.shape[1])[None].expand_as(ids)
        model(ids, positions)
    finally:
        for h in hooks:
            h.remove()
    return [hidden[0], rest]
