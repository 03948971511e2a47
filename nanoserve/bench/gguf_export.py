"""A GGUF file written from the checkpoint nanoserve runs, so llama.cpp runs the same weights.

Why this module exists: a speed ratio against llama.cpp means something only if both engines
read the same numbers. llama.cpp reads GGUF; nanoserve reads Hugging Face folders. This module
writes the GGUF from nanoserve's folder without re-quantizing anything:

- a dense Llama-family checkpoint: its matrices as BF16 (or F32), norms as F32;
- a compressed-tensors ``pack-quantized`` checkpoint, symmetric, group 32: each 8-bit linear
  as ``Q8_0`` and each 4-bit one as ``Q4_0``, from the checkpoint's own integers and scales.
  Both are blocks of 32 inputs with one fp16 scale ``d``, the layouts ``gguf.quants`` reads::

      Q8_0 block (34 bytes): d (fp16), then 32 int8 q;             w = d * q
      Q4_0 block (18 bytes): d (fp16), then 16 bytes of nibbles;   w = d * (u - 8), u = q + 8
                             byte j: low nibble = u[j], high nibble = u[j + 16]

  so a group-32 symmetric weight is a GGUF block exactly, as long as its scale is an fp16
  number: a bf16 scale converts exactly when it lies in fp16's range (checked, refused else).
  Any other group size, a zero point, or a W8A8 checkpoint has no such block and is refused.

The head stays as the checkpoint has it: a tied head is ``token_embd`` alone (BF16 in both
engines, the same bytes). The q and k projections' rows are reordered as llama.cpp's own
converter does for Llama (Hugging Face rotates the two halves of a head, llama.cpp adjacent
pairs); a quantized row keeps its scales, so the reorder is exact. The vocabulary comes from
``gguf_vocab.py``.

    export_gguf(checkpoint_dir, "build/model.gguf")                  # dense: BF16
    export_gguf(w4a16_dir, "build/model-q4_0.gguf")                   # Q4_0 from its integers
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from nanoserve.bench.gguf_vocab import add_vocab, gguf_vocab
from nanoserve.config.model import ModelConfig
from nanoserve.quantization.packing import unpack_int32
from nanoserve.quantization.weight import QuantizedWeight

BLOCK = 32  # Q8_0 and Q4_0 both hold 32 weights per scale
LAYER = {  # Hugging Face name under model.layers.{i}. -> GGUF name under blk.{i}.
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(hf: str) -> str:
    """``model.layers.3.mlp.up_proj`` -> ``blk.3.ffn_up`` (the ``.weight`` suffix is kept)."""
    stem, suffix = hf.rsplit(".", 1)
    if stem in TOP:
        return f"{TOP[stem]}.{suffix}"
    parts = stem.split(".")
    if parts[:2] == ["model", "layers"] and ".".join(parts[3:]) in LAYER:
        return f"blk.{parts[2]}.{LAYER['.'.join(parts[3:])]}.{suffix}"
    raise ValueError(f"{hf}: no GGUF name for this Llama tensor")


def rope_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that turns Hugging Face's half-split rotary layout into llama.cpp's
    adjacent pairs: new row (h, i, j) is old row (h, j, i), i < head_dim / 2, j < 2."""
    if rows % (2 * heads):
        raise ValueError(f"{rows} rows do not split into {heads} heads of even size")
    return torch.arange(rows).reshape(heads, 2, rows // heads // 2).transpose(1, 2).reshape(-1)


def fp16_scales(name: str, scale: torch.Tensor) -> np.ndarray:
    """The scales as fp16, refused unless every one converts exactly (finite, in range, and no
    mantissa bit lost)."""
    s16 = scale.to(torch.float16)
    exact = torch.isfinite(s16) & (s16.to(torch.float32) == scale.to(torch.float32))
    if not bool(exact.all()):
        bad = scale.flatten()[(~exact).flatten()][0].item()
        raise ValueError(f"{name}: weight_scale {bad!r} ({scale.dtype}) is not an fp16 "
                         f"number; a GGUF Q8_0/Q4_0 block stores its scale as fp16")
    return s16.numpy()


def q8_0_blocks(name: str, qw: QuantizedWeight) -> np.ndarray:
    """(N, K) 8-bit symmetric, group 32 -> (N, K / 32 * 34) uint8, the Q8_0 blocks."""
    N, K = _check_blocks(name, qw, 8)
    d = fp16_scales(name, qw.scale).reshape(N, K // BLOCK, 1).view(np.uint8)  # (N, G, 2)
    q = qw.q.numpy().reshape(N, K // BLOCK, BLOCK).view(np.uint8)  # (N, G, 32)
    return np.concatenate([d, q], axis=-1).reshape(N, -1)


def q4_0_blocks(name: str, qw: QuantizedWeight) -> np.ndarray:
    """(N, K) 4-bit symmetric, group 32 -> (N, K / 32 * 18) uint8, the Q4_0 blocks."""
    N, K = _check_blocks(name, qw, 4)
    d = fp16_scales(name, qw.scale).reshape(N, K // BLOCK, 1).view(np.uint8)  # (N, G, 2)
    u = (qw.q.numpy().astype(np.int16) + 8).astype(np.uint8).reshape(N, K // BLOCK, 2, 16)
    nibbles = u[:, :, 0, :] | (u[:, :, 1, :] << 4)  # (N, G, 16): first 16 low, last 16 high
    return np.concatenate([d, nibbles], axis=-1).reshape(N, -1)


def _check_blocks(name: str, qw: QuantizedWeight, bits: int) -> tuple[int, int]:
    kind = "Q8_0" if bits == 8 else "Q4_0"
    if qw.bits != bits or qw.group_size != BLOCK or qw.zero is not None or qw.perm is not None:
        raise ValueError(
            f"{name}: {qw.bits}-bit, group_size {qw.group_size}, "
            f"{'symmetric' if qw.zero is None else 'with zero points'}"
            f"{', act order' if qw.perm is not None else ''}; GGUF {kind} holds {bits}-bit "
            f"symmetric weights in groups of {BLOCK} only")
    if qw.act_bits is not None:
        raise ValueError(f"{name}: W8A8 quantizes activations too; {kind} is weight-only")
    return qw.shape


def read_checkpoint(folder: Path) -> tuple[dict, dict[str, torch.Tensor | QuantizedWeight]]:
    """The folder's config and tensors; a compressed-tensors ``pack-quantized`` layer's stored
    tensors are read into one ``<layer>.weight`` -> ``QuantizedWeight``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    hf: dict = {}
    for f in sorted(folder.glob("*.safetensors")):
        hf.update(load_file(f))
    if not hf:
        raise ValueError(f"{folder}: no *.safetensors")
    qc = config.get("quantization_config")
    if qc is None:
        return config, hf
    if qc.get("quant_method") != "compressed-tensors" or qc.get("format") != "pack-quantized":
        raise ValueError(f"{folder}: quantization_config quant_method="
                         f"{qc.get('quant_method')!r}, format={qc.get('format')!r}; the GGUF "
                         f"writer reads compressed-tensors pack-quantized (W8A16, W4A16) only")
    groups = list(qc.get("config_groups", {}).values())
    if len(groups) != 1:
        raise ValueError(f"{folder}: {len(groups)} config_groups; the GGUF writer takes one")
    w = groups[0]["weights"]
    if not w.get("symmetric", True):
        raise ValueError(f"{folder}: quantization_config weights.symmetric=false; GGUF Q8_0 "
                         f"and Q4_0 have no zero point")
    for key in [k for k in hf if k.endswith(".weight_packed")]:
        prefix = key[: -len(".weight_packed")]
        if f"{prefix}.weight_zero_point" in hf:
            raise ValueError(f"{prefix}.weight_zero_point: asymmetric weights; GGUF Q8_0 and "
                             f"Q4_0 have no zero point")
        N, K = (int(x) for x in hf.pop(f"{prefix}.weight_shape"))
        scale = hf.pop(f"{prefix}.weight_scale")
        q = unpack_int32(hf.pop(key), w["num_bits"], K)
        gs = w.get("group_size") or K
        hf[f"{prefix}.weight"] = QuantizedWeight(q, scale, None, w["num_bits"], gs).check(prefix)
    return config, hf


def _metadata(writer, mc: ModelConfig, file_type: int) -> None:
    writer.add_name(f"nanoserve export ({mc.model_type})")
    writer.add_context_length(mc.max_position_embeddings)
    writer.add_embedding_length(mc.hidden_size)
    writer.add_block_count(mc.num_hidden_layers)
    writer.add_feed_forward_length(mc.intermediate_size)
    writer.add_head_count(mc.num_attention_heads)
    writer.add_head_count_kv(mc.num_key_value_heads)
    writer.add_key_length(mc.head_dim)
    writer.add_value_length(mc.head_dim)
    writer.add_rope_dimension_count(mc.head_dim)
    writer.add_rope_freq_base(mc.rope_theta)
    writer.add_layer_norm_rms_eps(mc.rms_norm_eps)
    writer.add_vocab_size(mc.vocab_size)
    writer.add_file_type(file_type)
    writer.add_quantization_version(2)


def _check_llama(config: dict) -> ModelConfig:
    mc = ModelConfig.from_dict(config)  # rope_theta from either spelling of the RoPE keys
    if mc.model_type != "llama":
        raise ValueError(f"model_type {mc.model_type!r}: the GGUF writer writes Llama "
                         f"checkpoints only")
    for key in ("rope_scaling", "attention_bias", "mlp_bias", "sliding_window"):
        if getattr(mc, key):
            raise ValueError(f"config {key}={getattr(mc, key)!r}: not written to GGUF here")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config['hidden_act']!r}: llama.cpp's Llama is SiLU")
    return mc


def export_gguf(checkpoint: str | Path, out: str | Path, dense: str = "bf16") -> dict:
    """Write ``out`` (a .gguf) from ``checkpoint``; ``dense`` ("bf16" or "f32") is the type of
    every matrix that is not quantized. Returns what was written: each tensor's GGUF type and
    bytes, the vocabulary's source and the file's size."""
    import gguf

    if dense not in ("bf16", "f32"):
        raise ValueError(f"dense={dense!r}: choose bf16 or f32")
    config, hf = read_checkpoint(Path(checkpoint))
    mc = _check_llama(config)
    heads, kv = mc.num_attention_heads, mc.num_key_value_heads
    T = gguf.GGMLQuantizationType
    kinds = set()
    writer = gguf.GGUFWriter(str(out), "llama")
    written = {}
    if mc.tie_word_embeddings:
        hf.pop("lm_head.weight", None)  # tied: llama.cpp reads the head from token_embd
    for name in sorted(hf):
        t, gname = hf[name], gguf_name(name)
        if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
            rows = rope_rows(t.shape[0], heads if "q_proj" in name else kv)
            t = (QuantizedWeight(t.q[rows], t.scale[rows], None, t.bits, t.group_size)
                 if isinstance(t, QuantizedWeight) else t[rows])
        if isinstance(t, QuantizedWeight):
            blocks = (q8_0_blocks if t.bits == 8 else q4_0_blocks)(name.removesuffix(".weight"), t)
            kind = T.Q8_0 if t.bits == 8 else T.Q4_0
            writer.add_tensor(gname, blocks, raw_dtype=kind)
        elif t.dim() == 1 or dense == "f32":
            kind = T.F32
            writer.add_tensor(gname, t.to(torch.float32).numpy())
        else:
            kind = T.BF16
            writer.add_tensor(gname, t.to(torch.bfloat16).view(torch.int16).numpy(),
                              raw_dtype=kind)
        if isinstance(t, QuantizedWeight) or t.dim() == 2:
            kinds.add(kind)  # matrices name the file's type; norms are F32 in every file
        written[gname] = kind.name
    F = gguf.LlamaFileType
    file_type = (F.MOSTLY_Q4_0 if T.Q4_0 in kinds else F.MOSTLY_Q8_0 if T.Q8_0 in kinds
                 else F.MOSTLY_BF16 if T.BF16 in kinds else F.ALL_F32)
    _metadata(writer, mc, int(file_type))
    vocab = gguf_vocab(Path(checkpoint), config)
    add_vocab(writer, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"path": str(out), "bytes": Path(out).stat().st_size, "file_type": file_type.name,
            "tensors": written, "vocab": vocab.source}
