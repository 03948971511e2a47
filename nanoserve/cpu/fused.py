"""The Llama forward through the C++ ops: the same arithmetic as the model's own, fewer passes.

Why this module exists: ``nanoserve.model.llama`` is the reference, written op for op like
Hugging Face's so it can be held against transformers. On a CPU its small ops cost as much as its
matmuls at decode sizes. This forward keeps every matmul (plain or packed) and replaces the rest:

- the residual stream is carried beside the hidden state, and each add is fused into the next
  norm (``fused_add_rms_norm``: ``residual += h; h = norm(residual)``), as vLLM's layers do;
- RoPE rotates q and k in place, in the qkv projection's own output, and writes k and v into
  their pool cells in the same pass (``rope_and_cache``), when the attention backend can say
  where a step's tokens go (``write_cells()``) and then read without writing again
  (``attend_written``); other backends (Day 7's cache, graph windows, the compiled decode's
  opaque one) get rotated q, k, v and write them themselves;
- SiLU-and-multiply writes the MLP's product straight into one buffer;
- at decode size, where every linear takes the small-M kernel and the cache reads through the C++
  kernel, the whole layer loop is one op (``decode_layers``, csrc/decode_layers.cpp): the same
  calls in the same order, without the interpreter between them, so the same bits. Each
  layer's sliding window (Mistral's) goes with it (``windows``, 0 for a global layer); a model
  with no window passes none, and its call is what it was.

float32 results differ from the reference only where a sum is taken in another order (the
norm's sum of squares, the attention's dot products), so greedy tokens match. bf16 rounds at the
points where the reference rounds; the values can still differ by a rounding step where a sum
in another order lands on the other side of a boundary.
"""

from __future__ import annotations

import torch

ops = torch.ops.nanoserve


def _attention(attn, h, cos, sin, positions, backend, cells, nowhere, layer: int):
    B, T, _ = h.shape  # (B, T, E)
    Hq, Hkv, D = attn.hq, attn.hkv, attn.d
    qkv = attn.qkv_proj(h)  # (B, T, (Hq + 2 Hkv) D)
    q = qkv[..., :Hq * D].view(B * T, Hq, D)  # views into qkv: rotated in place
    k = qkv[..., Hq * D:(Hq + Hkv) * D].view(B * T, Hkv, D)
    v = qkv[..., (Hq + Hkv) * D:].view(B * T, Hkv, D)
    if cells is not None:
        ops.rope_and_cache(q, k, v, cos, sin, backend.k[layer], backend.v[layer], cells)
    else:  # rotate only: no cell is written (every cell -1, an empty pool)
        ops.rope_and_cache(q, k, v, cos, sin, nowhere[0], nowhere[0], nowhere[1])
    q4 = q.view(B, T, Hq, D).transpose(1, 2)  # (B, Hq, T, D)
    k4 = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    v4 = v.view(B, T, Hkv, D).transpose(1, 2)
    if cells is not None:
        out = backend.attend_written(layer, q4, k4, v4, positions)
    else:
        out = backend.attend(layer, q4, k4, v4, positions)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, Hq * D))


def _mlp(mlp, h):
    gu = mlp.gate_up_proj(h)  # (B, T, 2I)
    act = gu.new_empty(*gu.shape[:-1], mlp.i)  # (B, T, I)
    ops.silu_and_mul(act, gu)
    return mlp.down_proj(act)


def layer_weights(model) -> dict | None:
    """Each layer's norms and small-M copies as ``decode_layers`` takes them, and the largest
    batch every linear sends to the small-M kernel: built once, at load (``prepare_model``), into
    ``model.decode_layer_weights``. None where some linear has no small-M copy (not packed,
    oneDNN chosen for its shape) or sums over ranks (a tensor-parallel row)."""
    lists: dict = {k: [] for k in ("norm1", "norm2", "qkv_w", "qkv_b", "o_w", "o_b",
                                   "gate_up_w", "gate_up_b", "down_w", "down_b")}
    rows = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj,
                   "down": mlp.down_proj}
        if not all(getattr(m.method, "small", None) is not None and m.all_reduce is None
                   for m in linears.values()):
            return None
        for name, m in linears.items():
            lists[f"{name}_w"].append(m.method.small)
            lists[f"{name}_b"].append(m.method.bias)
            rows.append(m.method.rows)
        lists["norm1"].append(layer.input_layernorm.weight)
        lists["norm2"].append(layer.post_attention_layernorm.weight)
    windows = [w or 0 for w in getattr(model, "windows", ())]
    return {"lists": lists, "rows": min(rows, default=0),
            "dtype": lists["qkv_w"][0].dtype if rows else None,
            "windows": windows if any(windows) else None}


def _decode_layers(model, residual, cos, sin, backend, cells) -> torch.Tensor | None:
    """The layer loop as one op for a decode step that qualifies (``decode_layers``); None
    where fused_forward's own loop must run."""
    B, T, E = residual.shape
    if T != 1 or cells is None or torch.compiler.is_compiling():
        return None
    read = backend.kernel_decode() if hasattr(backend, "kernel_decode") else None
    weights = model.decode_layer_weights if read is not None else None
    if weights is None or B > weights["rows"] or residual.dtype != weights["dtype"]:
        return None
    cfg, (blocks, context_lens) = model.cfg, read
    attn = model.layers[0].self_attn
    res = residual.view(B, E)
    h = torch.empty_like(res)
    windows = weights.get("windows")  # each layer's window, 0: none; None: no layer has one
    ops.decode_layers(h, res, *weights["lists"].values(), cos, sin, backend.k, backend.v,
                      cells, blocks, context_lens, backend.block_size, attn.hq, attn.hkv,
                      model.layers[0].mlp.i, cfg.rms_norm_eps, attn.d ** -0.5,
                      *([windows] if windows else []))
    return h.view(B, T, E)


def fused_forward(model, input_ids: torch.Tensor, positions: torch.Tensor,
                  backend=None) -> torch.Tensor:
    """input_ids, positions (B, T) -> hidden (B, T, E), as ``Llama.forward`` computes it; no
    ``backend``: the model's own no-cache attention (``model.causal``)."""
    if backend is None:
        backend = model.causal
    residual = model.embed_tokens(input_ids)  # (B, T, E): the stream, updated in place
    B, T, E = residual.shape
    D = model.cfg.head_dim
    cos, sin = model.rope(positions, residual.dtype)  # (B, 1, T, D)
    cos, sin = cos.reshape(B * T, D), sin.reshape(B * T, D)
    cells = nowhere = None
    if hasattr(backend, "attend_written"):
        cells = backend.write_cells()  # (B * T,) this step's pool cells, -1 for padding
    else:
        Hkv = model.cfg.num_key_value_heads
        nowhere = (residual.new_empty(0, Hkv, D),
                   torch.full((B * T,), -1, dtype=torch.long, device=residual.device))
    eps = model.cfg.rms_norm_eps
    h = _decode_layers(model, residual, cos, sin, backend, cells)
    if h is not None:
        ops.fused_add_rms_norm(h, residual, model.norm.weight, eps)
        return h
    h = torch.empty_like(residual)
    for i, layer in enumerate(model.layers):
        if i == 0:
            ops.rms_norm(h, residual, layer.input_layernorm.weight, eps)
        else:
            ops.fused_add_rms_norm(h, residual, layer.input_layernorm.weight, eps)
        h = _attention(layer.self_attn, h, cos, sin, positions, backend, cells, nowhere, i)
        ops.fused_add_rms_norm(h, residual, layer.post_attention_layernorm.weight, eps)
        h = _mlp(layer.mlp, h)
    ops.fused_add_rms_norm(h, residual, model.norm.weight, eps)
    return h
