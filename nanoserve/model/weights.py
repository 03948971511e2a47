"""Safetensors loading and saving in the Hugging Face layout.

Why this module exists: a checkpoint on disk speaks Hugging Face's names
(``model.layers.3.self_attn.q_proj.weight``) and nanoserve's model fuses some of them (q, k and v
become one ``qkv_proj``; gate and up become one ``gate_up_proj``) so that each layer issues fewer,
larger matmuls. This module is the only place that knows both vocabularies. It reads a single
``model.safetensors`` or a sharded ``model.safetensors.index.json``, refuses a checkpoint with a
missing or unexpected tensor, and casts to the requested dtype.

The fused layout, for one layer (rows are output features)::

    qkv_proj.weight      = cat([q_proj (Hq*D), k_proj (Hkv*D), v_proj (Hkv*D)])   # dim 0
    gate_up_proj.weight  = cat([gate_proj (I), up_proj (I)])                       # dim 0

A checkpoint that stores them fused already, in that order (Phi-3's ``qkv_proj`` and
``gate_up_proj``), is read as it is.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nanoserve.config import ModelConfig
from nanoserve.model import quantized

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}

# fused nanoserve parameter -> the HF tensors it is made of, concatenated along dim 0
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
# per-layer tensors only some families have (biases; Qwen3's and Gemma's per-head q/k norms;
# Gemma's norms around the MLP)
OPTIONAL = ("self_attn.o_proj.bias", "mlp.down_proj.bias", "self_attn.q_norm.weight",
            "self_attn.k_norm.weight", "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight")
# A multimodal checkpoint (one whose config.json has a vision_config): where its language
# model's tensors sit (transformers' older and newer layouts), and what is not served
LANGUAGE_MODEL = {"language_model.model.": "model.", "model.language_model.": "model.",
                  "language_model.lm_head.": "lm_head."}
NOT_TEXT = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
            "model.multi_modal_projector.")

log = logging.getLogger("nanoserve")

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 matmuls


def cpu_flags() -> set[str]:
    """The processor's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_native_bf16(flags: set[str] | None = None) -> str | None:
    """The flag that makes bf16 matmuls native on this CPU (AMX or AVX512-BF16), else None.

    Without /proc/cpuinfo, torch's own dispatch level stands in: "AMX" anywhere in
    ``torch.backends.cpu.get_cpu_capability()``."""
    flags = cpu_flags() if flags is None else flags
    for flag in BF16_CPU_FLAGS:
        if flag in flags:
            return flag
    if not flags and "AMX" in torch.backends.cpu.get_cpu_capability():
        return "amx (torch cpu capability)"
    return None


def resolve_dtype(dtype: str | torch.dtype, cfg: ModelConfig | None = None,
                  device: str | torch.device = "cpu") -> torch.dtype:
    """Turn a user's dtype into a torch dtype (``choose_dtype`` without the reason)."""
    return choose_dtype(dtype, cfg, device)[0]


def choose_dtype(dtype: str | torch.dtype, cfg: ModelConfig | None = None,
                 device: str | torch.device = "cpu", kernel: bool = True,
                 onednn: bool = True) -> tuple[torch.dtype, str]:
    """(torch dtype, why) for a user's dtype.

    ``"auto"`` means the checkpoint's own dtype on a card. On a CPU it is whichever of bfloat16
    and float32 this processor runs the model's linears faster, measured once at load and cached
    per CPU model (``auto_dtype.choose``): the flags do not decide it (Day 52's flag rule stays
    in that chapter's snapshot). ``kernel`` and ``onednn`` say whether the engine may run the
    small-M kernel and oneDNN's packed linear; an arm it will not run is not timed. An explicit
    dtype is taken "as asked".
    """
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype={dtype} is not supported (float32, bfloat16, float16)")
        return dtype, "as asked"
    if dtype == "auto":
        if torch.device(device).type == "cpu":
            from nanoserve.cpu.auto_dtype import choose
            from nanoserve.cpu.measured import DEFAULT_SHAPE

            shape = (cfg.hidden_size, cfg.intermediate_size) if cfg is not None \
                else DEFAULT_SHAPE
            return choose(*shape, kernel=kernel, onednn=onednn)
        if cfg is None:
            return torch.float32, "no checkpoint dtype given"
        return DTYPES.get(cfg.torch_dtype, torch.float32), "the checkpoint's dtype"
    if dtype not in DTYPES:
        raise ValueError(
            f"dtype={dtype!r} is not supported; use one of: auto, {', '.join(sorted(DTYPES))}"
        )
    return DTYPES[dtype], "as asked"


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Map every tensor name in the checkpoint to the file holding it."""
    index = model_dir / "model.safetensors.index.json"
    single = model_dir / "model.safetensors"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: model_dir / fname for name, fname in weight_map.items()}
        for f in set(files.values()):
            if not f.is_file():
                raise ValueError(f"model folder {model_dir}: shard {f.name} named in "
                                 f"model.safetensors.index.json is missing")
        return files
    if single.is_file():
        with safe_open(single, framework="pt") as f:
            return {name: single for name in f.keys()}
    raise ValueError(f"model folder {model_dir}: neither model.safetensors nor "
                     f"model.safetensors.index.json is present")


def tensors_by_file(model_dir: str | Path) -> dict[Path, list[str]]:
    """The checkpoint's tensor names grouped by the file holding them, so each file opens once."""
    by_file: dict[Path, list[str]] = {}
    for name, f in tensor_files(Path(model_dir)).items():
        by_file.setdefault(f, []).append(name)
    return by_file


def load_hf_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, by its Hugging Face name, in its stored dtype."""
    out = {}
    for f, names in tensors_by_file(model_dir).items():
        with safe_open(f, framework="pt") as handle:
            for name in names:
                out[name] = handle.get_tensor(name)
    return out


def language_model_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name under a text model's names; None for the vision
    tower's and the projector's. One rank's load and a shard's (``tp.load``) both use it."""
    if name.startswith(NOT_TEXT):
        return None
    for old, new in LANGUAGE_MODEL.items():
        if name.startswith(old):
            return new + name.removeprefix(old)
    return name


def language_model_tensors(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A multimodal checkpoint's language model, under a text model's names; the vision tower
    and projector are left out, and the log says how many tensors that was."""
    out, skipped = {}, 0
    for name, t in hf.items():
        if (text := language_model_name(name)) is None:
            skipped += 1
            continue
        out[text] = t
    log.info("multimodal checkpoint: serving its language model only; %d vision tower and "
             "projector tensors not loaded", skipped)
    return out


def hf_to_nanoserve(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename and fuse HF tensors into nanoserve's parameter names. Refuses missing/extra names."""
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        used.add(name)
        return hf[name]

    out["embed_tokens.weight"] = take("model.embed_tokens.weight")
    out["norm.weight"] = take("model.norm.weight")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    else:  # the head reads the embedding (Llama.tie_weights): one tensor, both names
        out["lm_head.weight"] = out["embed_tokens.weight"]
        if "lm_head.weight" in hf:  # some tied checkpoints store the copy anyway
            used.add("lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        q = f"layers.{i}."
        for fused, parts in FUSED.items():
            for suffix in ("weight", "bias"):
                if f"{p}{fused}.{suffix}" in hf:  # stored fused already (Phi-3), same order
                    out[f"{q}{fused}.{suffix}"] = take(f"{p}{fused}.{suffix}")
                    continue
                names = [f"{p}{part}.{suffix}" for part in parts]
                if suffix == "bias" and names[0] not in hf:
                    continue
                out[f"{q}{fused}.{suffix}"] = quantized.cat_parts([take(n) for n in names],
                                                                  f"{q}{fused}.{suffix}")
        for plain in ("self_attn.o_proj.weight", "mlp.down_proj.weight",
                      "input_layernorm.weight", "post_attention_layernorm.weight",
                      *OPTIONAL):
            if plain in OPTIONAL and p + plain not in hf:
                continue  # the model's own parameters say whether it was due (assign_weights)
            out[q + plain] = take(p + plain)
    extra = sorted(set(hf) - used)
    if extra:
        raise ValueError(f"checkpoint has tensors nanoserve does not know: {extra[:5]}")
    return out


def nanoserve_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The inverse of ``hf_to_nanoserve``: split fused tensors back into HF names."""
    sizes = {
        "self_attn.qkv_proj": (cfg.q_size, cfg.kv_size, cfg.kv_size),
        "mlp.gate_up_proj": (cfg.intermediate_size, cfg.intermediate_size),
    }
    out = {}
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name.startswith("layers."):
            layer, rest = name.split(".", 2)[1], name.split(".", 2)[2]
            prefix = f"model.layers.{layer}."
            module, suffix = rest.rsplit(".", 1)
            if module in FUSED:
                for part, chunk in zip(FUSED[module], t.split(sizes[module], dim=0), strict=True):
                    out[f"{prefix}{part}.{suffix}"] = chunk.contiguous()
                continue
            out[prefix + rest] = t.contiguous()
        elif name == "lm_head.weight":
            out[name] = t.contiguous()
        else:
            out["model." + name] = t.contiguous()
    return out


def save_checkpoint(model: torch.nn.Module, cfg: ModelConfig, model_dir: str | Path,
                    dtype: torch.dtype = torch.float32) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the HF layout."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    save_file(nanoserve_to_hf(state, cfg), model_dir / "model.safetensors",
              metadata={"format": "pt"})
    d = cfg.to_dict()
    d["torch_dtype"] = str(dtype).removeprefix("torch.")
    (model_dir / "config.json").write_text(json.dumps(d, indent=2) + "\n")


def load_model(model_dir: str | Path, dtype: str | torch.dtype = "auto",
               device: str | torch.device = "cpu", max_model_len: int | None = None):
    """Build the checkpoint's model (its family from ``model.registry``) from a folder, without
    ever running a random init; ``max_model_len`` is the engine's (default: the model's own
    ``max_position_embeddings``), which a longrope family reads."""
    from nanoserve.model.registry import model_class

    cfg = ModelConfig.from_dir(model_dir)
    family = model_class(cfg)
    torch_dtype = resolve_dtype(dtype, cfg, device)
    hf = load_hf_state_dict(model_dir)
    if cfg.extra.get("vision_config") is not None:
        hf = language_model_tensors(hf)
    hf = quantized.read(hf, cfg)  # each quantized layer's tensors -> one QuantizedWeight
    state = hf_to_nanoserve(hf, cfg)
    with torch.device("meta"):
        model = family(cfg, max_model_len)
    assign_weights(model, state, torch_dtype, device, "checkpoint does not match config.json")
    model.quantization = quantized.describe(hf, cfg)
    return model


def assign_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype,
                   device: str | torch.device, mismatch: str) -> torch.nn.Module:
    """Fill a model built on the meta device with ``state`` (nanoserve's names), refusing any
    tensor missing, extra or of another shape (``mismatch`` opens the message), then let the
    family finish (``finish_load``: a tied head, its rotary frequencies). A tensor filed under
    two names (a tied head) is cast once. A ``QuantizedWeight`` becomes its linear's method
    (``model/quantized.py``), its integers as stored. Shared by one rank's load and a
    shard's."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if expected != got:
        bad = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
        raise ValueError(f"{mismatch} at {bad[:3]}: expected {[expected.get(k) for k in bad[:3]]}"
                         f", found {[got.get(k) for k in bad[:3]]}")
    state, quantized_weights = quantized.split_quantized(state)
    layers = quantized.release(model, quantized_weights)
    cast: dict[int, torch.Tensor] = {}  # by the source tensor: a tied head's is cast once
    for v in state.values():
        if id(v) not in cast:
            cast[id(v)] = v.to(device=device, dtype=dtype)
    model.load_state_dict({k: cast[id(v)] for k, v in state.items()}, assign=True)
    quantized.install_all(layers, quantized_weights, dtype, device)  # after their biases
    model.finish_load(device)
    return model.eval()
