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
- at decode size, where every linear takes the small-M kernel (or every linear is a quantized
  weight whose kernel takes the batch) and the cache reads through the C++ kernel, the whole
  layer loop is one op (``decode_layers``, csrc/decode_layers.cpp, or ``decode_layers_quant``,
  csrc/decode_layers_quant.cpp): the same calls in the same order, without the interpreter
  between them, so the same bits. Each
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


_SLOTS = ("qkv", "o", "gate_up", "down")  # each layer's linears, in the order the loop runs them


def _linears(layer) -> list:
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]


def _quantized(method) -> bool:
    """A quantized kernel method (``layers.linear_quant.QuantKernelLinear``) whose C++ kernel
    runs at decode size: no act order (its input would be gathered first), no fallback, and
    the packed layout the C++ kernels read (``quant_gemm.pack``: 3-D; ``pack_int8``: one row of
    bytes per 32 outputs), not a stand-in's."""
    qw, packed = getattr(method, "qw", None), getattr(method, "packed", None)
    if qw is None or packed is None or getattr(method, "why", "") is not None:
        return False
    blocks = -(-qw.shape[0] // 32)
    laid_out = (packed.dim() == 2 and packed.shape[0] == blocks if qw.act_bits is not None
                else packed.dim() == 3 and packed.shape[0] == blocks)
    return laid_out and qw.perm is None and method.rows > 0


def layer_weights(model) -> dict | None:
    """Each layer's norms and linears as ``decode_layers`` (every linear a small-M copy) or
    ``decode_layers_quant`` (every linear a quantized kernel's packed weight) takes them, and the
    largest batch every linear sends to its kernel: built once, at load (``prepare_model``), into
    ``model.decode_layer_weights``. None where some linear has neither (not packed, oneDNN
    chosen for its shape, the dequantized fallback, act order), the model mixes the two, or a
    linear sums over ranks (a tensor-parallel row)."""
    methods = [m.method for layer in model.layers for m in _linears(layer)]
    if any(m.all_reduce is not None for layer in model.layers for m in _linears(layer)):
        return None
    norms = {"norm1": [layer.input_layernorm.weight for layer in model.layers],
             "norm2": [layer.post_attention_layernorm.weight for layer in model.layers]}
    if all(getattr(m, "small", None) is not None for m in methods):
        lists: dict = {**norms, **{f"{n}_{k}": [] for n in _SLOTS for k in ("w", "b")}}
        for i, m in enumerate(methods):
            lists[f"{_SLOTS[i % 4]}_w"].append(m.small)
            lists[f"{_SLOTS[i % 4]}_b"].append(m.bias)
        dtype, quant = methods[0].small.dtype if methods else None, False
    elif methods and all(_quantized(m) for m in methods):
        if len({m.dtype for m in methods}) != 1:
            return None
        lists = {**norms, "packed": [m.packed for m in methods],
                 "w_scale": [m.scale for m in methods], "w_zero": [m.zero for m in methods],
                 "bias": [m.bias for m in methods], "bits": [m.qw.bits for m in methods],
                 "group_size": [m.qw.group_size for m in methods],
                 "act_bits": [m.qw.act_bits or 0 for m in methods]}
        dtype, quant = methods[0].dtype, True
    else:
        return None
    windows = [w or 0 for w in getattr(model, "windows", ())]
    return {"lists": lists, "rows": min((m.rows for m in methods), default=0),
            "dtype": dtype, "quant": quant, "windows": windows if any(windows) else None}


def _decode_layers(model, residual, cos, sin, backend, cells) -> torch.Tensor | None:
    """The layer loop as one op for a decode step that qualifies (``decode_layers``, or
    ``decode_layers_quant`` for a quantized model); None where fused_forward's own loop must
    run."""
    B, T, E = residual.shape
    if T != 1 or cells is None or torch.compiler.is_compiling():
        return None
    read = backend.kernel_decode() if hasattr(backend, "kernel_decode") else None
    weights = model.decode_layer_weights if read is not None else None
    if weights is None or residual.dtype != weights["dtype"]:
        return None
    if B > weights["rows"] and not getattr(backend, "verifying", False):
        return None
    cfg, (blocks, context_lens) = model.cfg, read
    attn = model.layers[0].self_attn
    res = residual.view(B, E)
    h = torch.empty_like(res)
    windows = weights.get("windows")  # each layer's window, 0: none; None: no layer has one
    op = ops.decode_layers_quant if weights["quant"] else ops.decode_layers
    op(h, res, *weights["lists"].values(), cos, sin, backend.k, backend.v, cells, blocks,
       context_lens, backend.block_size, attn.hq, attn.hkv, model.layers[0].mlp.i,
       cfg.rms_norm_eps, attn.d ** -0.5, *([windows] if windows else []))
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
