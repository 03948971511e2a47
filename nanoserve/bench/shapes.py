"""Published checkpoint shapes, and random weights written in them.

Why this module exists: a speed measured on a toy model says little about a real one, and the
real checkpoints are gated downloads. Random weights in the exact shape of a published model
cost the same bytes and FLOPs per token, so the benchmarks (``nanoserve bench offline --shape``),
the GPU check and the chapters all build on these dicts, written here once. ``tiny`` is the
shipped nanoserve-tiny's own config.

```pycon
>>> cfg = shape_config("smollm2-135m")
>>> cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]
(576, 30, 3)
>>> SHAPES["llama-3.2-1b"] is LLAMA_3_2_1B
True

```
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from nanoserve.config import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parents[2]
SHAPE_CACHE = ROOT / "build" / "offline-checkpoints"

# HuggingFaceTB/SmolLM2-135M's config.json, as published.
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "rope_scaling": None, "tie_word_embeddings": True, "bos_token_id": 0,
    "eos_token_id": 0, "torch_dtype": "bfloat16",
}

# meta-llama/Llama-3.2-1B's config.json, as published: the shape GPU benchmarks use.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}

# Qwen/Qwen3-0.6B's config.json, as published (the keys that shape the math): per-head q/k
# norms, head_dim 128 where hidden / heads is 64, tied embeddings, no window.
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_scaling": None, "attention_bias": False, "use_sliding_window": False,
    "sliding_window": None, "max_window_layers": 28, "tie_word_embeddings": True,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}

# google/gemma-3-270m's config.json, as published (the keys that shape the math): five local
# layers (a 512-token window, RoPE base 10,000) to each global one (base 1,000,000), one KV
# head of 256, a 262,144-token vocabulary tied to the embedding.
GEMMA_3_270M = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
    "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": None, "sliding_window": 512,
    "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
    "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                    for i in range(18)],
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}

SHAPES: dict[str, dict] = {"smollm2-135m": SMOLLM2_135M, "llama-3.2-1b": LLAMA_3_2_1B,
                           "qwen3-0.6b": QWEN3_0_6B, "gemma-3-270m": GEMMA_3_270M}


def shape_config(name: str) -> dict:
    """A copy of the named shape's config; ``tiny`` is the shipped nanoserve-tiny's own."""
    if name == "tiny":
        return json.loads((DEFAULT_MODEL / "config.json").read_text())
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose one of {['tiny', *SHAPES]}")
    return json.loads(json.dumps(SHAPES[name]))  # deep: rope_scaling is a dict too


def shape_checkpoint(name: str, cache: Path = SHAPE_CACHE, seed: int = 0) -> Path:
    """A folder of random weights in the named shape, written by transformers' ``save_pretrained``
    (in the shape's published dtype) under ``build/``; made once, then reused."""
    out = Path(cache) / f"{name}-seed{seed}"
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = shape_config(name)
    dtype = getattr(torch, cfg.pop("torch_dtype", "float32") or "float32")
    model_type = cfg.pop("model_type")
    for key in ("architectures", "dtype"):
        cfg.pop(key, None)
    torch.manual_seed(seed)  # the family's own transformers classes write the folder
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg)).to(dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    model.save_pretrained(tmp)
    tmp.chmod(0o755)  # mkdtemp's 0700 would keep the folder from other users
    try:
        tmp.rename(out)  # atomic: a concurrent run sees the whole folder or none of it
    except OSError:  # another run finished first; its folder is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    return out
