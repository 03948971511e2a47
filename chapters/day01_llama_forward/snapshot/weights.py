"""Day 1 snapshot: read a Hugging Face safetensors checkpoint with nothing but json and torch.

A ``.safetensors`` file is an 8-byte little-endian header length, a JSON header that gives each
tensor's dtype, shape and byte range, and then the raw bytes. This reader is the whole format.
Frozen: imports only the standard library, torch and this snapshot.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from .config import ModelConfig
from .model import Llama, rope_inv_freq

ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
             "I64": torch.int64}
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        dtype = ST_DTYPES[info["dtype"]]
        t = torch.frombuffer(bytearray(body[a:b]), dtype=dtype) if b > a else \
            torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for f in files:
        state.update(read_safetensors(model_dir / f))
    return state


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> Llama:
    cfg = ModelConfig.from_dir(model_dir)
    hf = read_checkpoint(model_dir)
    state = {"embed_tokens.weight": hf["model.embed_tokens.weight"],
             "norm.weight": hf["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = hf["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for fused, parts in FUSED.items():
            for suffix in ("weight", "bias"):
                if p + f"{parts[0]}.{suffix}" in hf:
                    state[f"layers.{i}.{fused}.{suffix}"] = torch.cat(
                        [hf[f"{p}{part}.{suffix}"] for part in parts])
        for name in ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight",
                     "mlp.down_proj.bias", "input_layernorm.weight",
                     "post_attention_layernorm.weight"):
            if p + name in hf:
                state[f"layers.{i}.{name}"] = hf[p + name]
    with torch.device("meta"):
        model = Llama(cfg)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True, strict=True)
    model.inv_freq = rope_inv_freq(cfg)
    return model.eval()
