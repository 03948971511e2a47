# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 71 notebook: holding a family against transformers without a download
#
# transformers writes a small random checkpoint; nanoserve and transformers both load the
# folder; their float32 logits and greedy tokens are compared. Then the question that makes
# the comparison worth something: would it have failed had a feature been ignored? In about a
# minute on a CPU:
#
# 1. one checkpoint written and opened both ways;
# 2. the weights transformers leaves constant, and the draws that make them count;
# 3. every negative control beside the parity it would break;
# 4. each family on each path;
# 5. the two places where parity is a choice.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import json

import torch
from safetensors import safe_open

from chapters.day71_family_parity import claims
from chapters.day71_family_parity.snapshot import parity
from nanoserve.testing import greedy_logits

# %% [markdown]
# ## 1. One checkpoint, two readers
#
# `write_hf_checkpoint(path, "gemma3", family="gemma3")` builds `Gemma3TextConfig` and
# `Gemma3ForCausalLM` and calls `save_pretrained`. The folder is what a published model's
# folder looks like; nanoserve wrote none of it.

# %%
gemma = claims.checkpoint("Gemma 3")
print(sorted(f.name for f in gemma.iterdir()))
cfg = json.loads((gemma / "config.json").read_text())
print({k: cfg[k] for k in ("architectures", "head_dim", "hidden_size", "num_attention_heads",
                           "sliding_window", "layer_types", "query_pre_attn_scalar",
                           "rope_parameters", "final_logit_softcapping")})
with safe_open(gemma / "model.safetensors", "pt") as f:
    names = list(f.keys())
print(len(names), "tensors, layer 0's:", [n for n in names if ".layers.0." in n])

# %% [markdown]
# Both sides run the same prompt greedily; the snapshot's `compare` gives the largest logit
# difference over every step and whether every greedy token agreed.

# %%
prompt = claims.PROMPTS[1]
tokens, theirs = claims.transformers_greedy(gemma)[1]
llm = claims.engine(gemma, **claims.PLAIN)
ours = greedy_logits(llm, list(prompt), claims.STEPS)
diff, same = parity.compare(ours, theirs)
print(f"{len(prompt)}-token prompt, {claims.STEPS} steps: largest |difference| {diff:.2e} "
      f"({parity.verdict(diff)} against {parity.BOUND:g}), tokens identical: {same}")
print("transformers' tokens:", tokens)

# %% [markdown]
# ## 2. What transformers leaves constant
#
# A fresh model's biases are zeros and its norm weights ones (Gemma's `1 + w` norms: zeros).
# `write_hf_checkpoint` draws them again, except in Llama and Mistral. Each checkpoint's norm
# and bias tensors, summarised:

# %%
for name in claims.FAMILIES:
    with safe_open(claims.checkpoint(name) / "model.safetensors", "pt") as f:
        norms = torch.cat([f.get_tensor(n).flatten() for n in f.keys()
                           if n.endswith("norm.weight")])
        biases = [f.get_tensor(n) for n in f.keys() if n.endswith("bias")]
    b = f"biases mean |b| {torch.cat(biases).abs().mean():.3f}" if biases else "no biases"
    print(f"{name:8s} norms: mean {norms.mean():.3f}, std {norms.std():.3f}; {b}")

# %% [markdown]
# Why Gemma's norms are drawn around 0 and not around 1: on a copy drawn around 1, each
# `(1 + w)` norm roughly doubles what passes through it, and transformers no longer agrees
# with itself (its cached decode against one forward over the sequence) within the bound.

# %%
for label, path in (("norms around 0", gemma), ("norms around 1", claims.gemma_norms_around_one())):
    spread = claims.transformers_self_spread(path)
    print(f"transformers vs itself, Gemma 3, {label}: {spread:.1e} "
          f"({'inside' if spread <= parity.BOUND else 'outside'} the bound)")

# %% [markdown]
# ## 3. Negative controls
#
# The same parity measurement with one feature taken away. A control counts only when the
# difference it makes is far past the bound. Llama's norms are already ones, so resetting them
# is the control that cannot fail.

# %%
CONTROLS = {
    "Mistral: window removed": claims.mistral_window,
    "Gemma 3: window widened to 64": claims.gemma_window,
    "Gemma 3: local layers on the global base": claims.gemma_local_base,
    "Phi-3: partial rotary made whole": claims.phi3_whole_rotary,
    "Phi-3: long factors replaced by the short": claims.phi3_short_for_long,
    "Qwen2: q/k/v biases zeroed": lambda: claims.weight_control("Qwen2", ("bias",), 0.0),
    "Qwen3: q/k norms reset to 1": lambda: claims.weight_control(
        "Qwen3", ("q_norm.weight", "k_norm.weight"), 1.0),
    "Gemma 3: norms reset to 0": lambda: claims.weight_control("Gemma 3", claims.NORMS, 0.0),
    "Qwen2: norms reset to 1": lambda: claims.weight_control("Qwen2", claims.NORMS, 1.0),
    "Llama: norms reset to 1": lambda: claims.weight_control("Llama", claims.NORMS, 1.0),
}
for label, fn in CONTROLS.items():
    d = fn()
    print(f"{label:45s} {d:9.2e}  caught: {parity.control_catches(d)}")

# %% [markdown]
# ## 4. Every family, every path
#
# Reference and gathered attention, whole and chunked (a budget of 8 tokens), and the default
# engine where it takes the model; then the shared-prefix run through a small pool with prefix
# caching (a hit, a preemption, every block back). `-tp 2` is a claim of the chapter, not run
# here: it spawns a worker process.

# %%
for name in claims.FAMILIES:
    print(name)
    for path, r in claims.family_paths(name).items():
        print(f"   {path:20s} " + (r if isinstance(r, str) else
                                   f"{r[0]:.1e}, tokens identical: {r[1]}"))
    print(f"   {'shared prefix':20s} transformers' tokens, hit, preemption, blocks back: "
          f"{claims.shared_prefix(name)}")

# %% [markdown]
# ## 5. Where parity is a choice
#
# Phi-3's longrope: the engine picks the factors once, by `max_model_len`; transformers per
# forward. A 12-token prompt (within the original 16) on an engine of 16 agrees; on an engine
# of 128 the engine uses the long factors where transformers uses the short ones.

# %%
for n in (16, 128):
    print(f"engine of max_model_len {n}: {claims.phi3_short_prompt(n):.2e}")

# %% [markdown]
# Gemma's q factor `sqrt(head_dim / query_pre_attn_scalar)` rounds nothing only when the ratio
# is a power of 4. The published models' pairs, and the test checkpoints':

# %%
for label, hd, scalar in (("Gemma 3 1B and 4B", 256, 256), ("Gemma 3 27B", 128, 168),
                          ("test model", 32, 8), ("test model, the 27B's ratio", 32, 42)):
    print(f"{label:30s} head_dim {hd}, scalar {scalar}: exact factor "
          f"{parity.q_factor_exact(hd, scalar)}")
for name in ("Gemma 3", "Gemma 3 scalar 42"):
    print(f"{name}: prompt logits against transformers, largest difference "
          f"{claims.gemma_prompt_diff(name):.2e}")
