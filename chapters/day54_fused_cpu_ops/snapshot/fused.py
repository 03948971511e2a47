"""Day 54 snapshot (frozen): the Llama forward rewritten around fused ops.

Why this module exists: the plain forward (Day 1's ``Llama.forward``) is written op for op like
Hugging Face's, which is what makes it checkable, and on a CPU at decode sizes it is also what
makes it slow: every small op is a dispatch, an allocation and a pass over memory. This forward
keeps every matmul and reorganises the rest around four fused ops, which it takes as ``ops``
(``torch.ops.nanoserve`` once the package has built them, or ``REFERENCE_OPS``):

- The residual stream is its own buffer, updated in place. Each layer's ``x = x + f(norm(x))``
  becomes "add ``f``'s output into the stream, then normalise the stream", and that add-then-
  normalise is one op, ``fused_add_rms_norm``. The first norm has nothing to add (``rms_norm``).
- q, k and v are views into the qkv projection's output. ``rope_and_cache`` rotates q and k in
  place and, where the backend can say which pool cell each token goes to (``write_cells``),
  writes k and v there in the same pass; the backend then reads without writing again
  (``attend_written``). Any other backend is handed the rotated views and writes them itself.
- ``silu_and_mul`` writes the MLP's product into one buffer, with no split copies.

Shapes: B batch, T new tokens, E hidden, Hq/Hkv heads, D head_dim, I intermediate.

Over the references the result is Day 1's forward, bit for bit (the chapter's claims and
``tests/test_day54.py`` check it on real checkpoints):

    >>> h = fused_forward(model, ids, pos, ops=REFERENCE_OPS)   # doctest: +SKIP
    >>> torch.equal(h, model(ids, pos))   # doctest: +SKIP
    True
"""

from __future__ import annotations

import torch

from chapters.day01_llama_forward.snapshot.model import causal_attention, rope_cos_sin

from .reference_ops import REFERENCE_OPS


def _attention(attn, h, cos, sin, positions, backend, cells, layer: int, ops):
    B, T, _ = h.shape  # (B, T, E)
    Hq, Hkv, D = attn.hq, attn.hkv, attn.d
    qkv = attn.qkv_proj(h)  # (B, T, (Hq + 2 Hkv) D)
    q = qkv[..., :Hq * D].view(B * T, Hq, D)  # views into qkv: rotated in place
    k = qkv[..., Hq * D:(Hq + Hkv) * D].view(B * T, Hkv, D)
    v = qkv[..., (Hq + Hkv) * D:].view(B * T, Hkv, D)
    if cells is not None:
        ops.rope_and_cache(q, k, v, cos, sin, backend.k[layer], backend.v[layer], cells)
    else:  # rotate only: an empty pool and every token marked as padding
        none = qkv.new_empty(0, Hkv, D)
        ops.rope_and_cache(q, k, v, cos, sin, none, none,
                           torch.full((B * T,), -1, dtype=torch.long, device=h.device))
    q4 = q.view(B, T, Hq, D).transpose(1, 2)  # (B, Hq, T, D)
    k4 = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    v4 = v.view(B, T, Hkv, D).transpose(1, 2)
    if backend is None:
        out = causal_attention(q4, k4, v4)
    elif cells is not None:
        out = backend.attend_written(layer, q4, k4, v4, positions)
    else:
        out = backend.attend(layer, q4, k4, v4, positions)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, Hq * D))


def _mlp(mlp, h, ops):
    gu = mlp.gate_up_proj(h)  # (B, T, 2I)
    act = gu.new_empty(*gu.shape[:-1], mlp.i)  # (B, T, I)
    ops.silu_and_mul(act, gu)
    return mlp.down_proj(act)


def fused_forward(model, input_ids: torch.Tensor, positions: torch.Tensor, backend=None,
                  ops=REFERENCE_OPS) -> torch.Tensor:
    """input_ids, positions (B, T) -> hidden (B, T, E), as ``Llama.forward`` computes it."""
    residual = model.embed_tokens(input_ids)  # (B, T, E): the stream, updated in place
    B, T, E = residual.shape
    D = model.cfg.head_dim
    cos, sin = rope_cos_sin(model.inv_freq, positions, residual.dtype)  # (B, 1, T, D)
    cos, sin = cos.reshape(B * T, D), sin.reshape(B * T, D)
    cells = None
    if backend is not None and hasattr(backend, "attend_written"):
        cells = backend.write_cells()  # (B * T,) this step's pool cells, -1 for padding
    eps = model.cfg.rms_norm_eps
    h = torch.empty_like(residual)
    for i, layer in enumerate(model.layers):
        if i == 0:
            ops.rms_norm(h, residual, layer.input_layernorm.weight, eps)
        else:  # the previous layer's MLP output joins the stream here
            ops.fused_add_rms_norm(h, residual, layer.input_layernorm.weight, eps)
        h = _attention(layer.self_attn, h, cos, sin, positions, backend, cells, i, ops)
        ops.fused_add_rms_norm(h, residual, layer.post_attention_layernorm.weight, eps)
        h = _mlp(layer.mlp, h, ops)
    ops.fused_add_rms_norm(h, residual, model.norm.weight, eps)
    return h
