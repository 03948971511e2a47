# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 69 notebook: model families, one engine
#
# Six families share one forward pass; each says where it differs through hooks that read its
# `config.json`. In well under a minute on a CPU, with nothing downloaded:
#
# 1. the registry: what it serves and what it says to anything else;
# 2. every family's hooks on a small config, the table of the math printed from code;
# 3. the Qwen3-0.6B and Gemma-3-270M shapes built on the meta device;
# 4. keys the engine cannot honour, refused by name;
# 5. a multimodal Gemma 3 checkpoint served as its language model;
# 6. Phi-3's longrope factors, chosen once per engine, and what a per-forward choice would do
#    to a prefix cache;
# 7. the C++ forward and tensor parallelism per family, and the frozen snapshot.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.day69_model_families import claims  # noqa: E402
from chapters.day69_model_families.snapshot import registry as frozen  # noqa: E402
from nanoserve.model.registry import MODEL_FAMILIES, model_class  # noqa: E402

# %% [markdown]
# ## 1. The registry
#
# A checkpoint's `architectures` entry is looked up here; its class builds the model.

# %%
for arch, path in MODEL_FAMILIES.items():
    print(f"{arch:32s} -> {path}")
print(claims.served())

try:
    model_class(claims._cfg(claims._tiny("GemmaForCausalLM", "gemma")))
except ValueError as e:
    print("\nGemma 1:", e)

# %% [markdown]
# ## 2. Each family's hooks
#
# One small config per family (`claims.TINY`; Mistral and Gemma with a window). The printout
# is the table of the math as the code decides it: the layer's biases and q/k norm, the class
# of its decoder layer and norm, the MLP's activation, each layer's window, the RoPE scalings
# it computes, and why the C++ forward would pass it by.

# %%
for name, d in claims.TINY.items():
    cfg = claims._cfg(d)
    fam = model_class(cfg)
    shape = fam.layer_shape(cfg)
    act = fam.activation(cfg)
    print(f"{name}: bias qkv={shape.qkv_bias} o={shape.o_bias} mlp={shape.mlp_bias}, "
          f"q/k norm={shape.qk_norm and shape.qk_norm_class.__name__}, q_scale={shape.q_scale:g}")
    print(f"  layer {fam.layer_class.__name__}, norm {fam.norm_class.__name__}, "
          f"activation {getattr(act, 'func', act).__name__}{getattr(act, 'keywords', '') or ''}")
    print(f"  windows {fam.layer_windows(cfg)}, rope_types {fam.rope_types}, "
          f"fused_problem {fam.fused_problem!r}")

# %% [markdown]
# ## 3. The published shapes on the meta device
#
# Every tensor has its real shape and no memory. The parameters, the embedding's share, the
# LM head's share of a decoded token's linear work, Gemma's layers, and the norms one layer
# runs on one token (a meta forward, counted with hooks).

# %%
print(f"Qwen3-0.6B: {claims.parameters('qwen3-0.6b'):,} parameters, LM head "
      f"{claims.head_share('qwen3-0.6b'):.1%} of a token's linear multiply-adds")
print(f"Gemma-3-270M: {claims.gemma_parameters()}, LM head "
      f"{claims.head_share('gemma-3-270m'):.1%} of a token's linear multiply-adds")
print("Gemma-3-270M layers windowed:", claims.gemma_layers())
gemma = claims.meta_model("gemma-3-270m")
print("  types:", ["L" if w else "G" for w in gemma.windows])
for shape in ("qwen3-0.6b", "gemma-3-270m"):
    calls, ratio = claims.norm_work(shape)
    print(f"{shape}: {calls} norm calls in a layer, {ratio:.1f}x the values a Llama layer "
          "normalises")
print("Phi-4-mini-like: dims turned; layers served windowed:", claims.phi4_like())

# %% [markdown]
# ## 4. Refused by name
#
# Each of these configs asks for math the engine does not compute. The message names the key
# and its value.

# %%
for d, key in claims.REFUSED:
    try:
        model_class(claims._cfg(d))
        print("served?!", key)
    except ValueError as e:
        print(f"- {e}")

# %% [markdown]
# ## 5. A multimodal checkpoint's language model
#
# transformers writes a tiny `Gemma3ForConditionalGeneration`; the loader lifts its
# `text_config`, keeps the language model's tensors and leaves the vision tower on disk.

# %%
total, text, skipped, served_by = claims.multimodal_counts()
print(f"{total} tensors: {text} served by {served_by}, {skipped} left out")

# %% [markdown]
# ## 6. Longrope: factors once per engine
#
# The tiny Phi-3 has a short original length. An engine picks its factors from its
# `max_model_len`; below, a longer prompt reads its start from the prefix cache (`claims.PREFIX`,
# served first), once with the engine's own factors and once with the cached keys turned by
# the short factors, as a per-forward rule would have turned the shorter forward.

# %%
print("factors at max_model_len 16, 128:", claims.factors_chosen())
runs = claims.prefix_runs()
for name, (tokens, hits) in runs.items():
    print(f"{name:12s} tokens {tokens}  prefix tokens from the cache: {hits}")
print("engine's rule:", claims.static_row())
print("per-forward: ", claims.per_forward_row())

# %% [markdown]
# ## 7. The C++ forward, tensor parallelism, and the frozen registry

# %%
from nanoserve.tp.layers import tp_class  # noqa: E402

print("layers in the C++ forward:", claims.cpp_families())
for d in claims.TINY.values():
    fam = model_class(claims._cfg(d))
    print(f"  {tp_class(fam).__name__}: {[c.__name__ for c in tp_class(fam).__mro__[:3]]}")
print("tensor parallel, as themselves:", claims.tp_families())
print("snapshot agrees with the package:", claims.snapshot_agrees())
qwen = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 4,
        "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2}
print("frozen Qwen2 windows:", frozen.family(qwen).windows(qwen))
