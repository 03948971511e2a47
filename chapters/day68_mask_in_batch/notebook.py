# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 68 notebook: the mask in the batch
#
# Day 67 put a grammar's mask in front of the sampler. Here it is measured where it lives, in
# a batch that also holds free rows, on the shipped nanoserve-tiny in float32. In about a
# minute on a CPU:
#
# 1. a decode batch of 8 rows with 4 constrained, against the same batch with none;
# 2. what a new request's grammar costs, compiled cold and copied from the cache;
# 3. the compile-once cache over a skewed stream of specs, beside the frozen LRU;
# 4. the mask's two halves as the vocabulary grows: the library's fill, and the application
#    to the logits in PyTorch and in the C++ op.
#
# Every timing below belongs to the machine that ran the notebook; the chapter's claims say
# which of them are bounds and under what condition.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.day68_mask_in_batch.claims import cache_counts, llm, stream
from chapters.day68_mask_in_batch.snapshot.templates import TemplateLRU
from nanoserve.bench.hardware import describe_hardware
from nanoserve.bench.structured import apply_costs, compile_costs, overhead, vocab_costs

print(describe_hardware())

# %% [markdown]
# ## 1. Four constrained rows beside four free ones
#
# Both arms decode the same 8 prompts for 64 tokens with EOS ignored; the constrained rows'
# schema needs 50 objects, so none of them can finish early. The sampler's mask is timed from
# inside: the fill (llguidance walking each row's grammar over the vocabulary) and the
# application (setting the banned logits to `-inf`).

# %%
o = overhead(llm(), rows=8, constrained=4, tokens=64, rounds=3)
print(f"ms per step: none {o['ms_per_step']['none']:.2f}, half {o['ms_per_step']['half']:.2f} "
      f"-> {o['ratio']:.2f}x")
print(f"mask per step: fill {o['fill_ms_per_step']:.3f} ms + apply "
      f"{o['apply_ms_per_step']:.3f} ms = {o['mask_share']:.1%} of the constrained step")
print("free rows unchanged by their neighbours' grammar:", o["free_rows_unchanged"])
print("a constrained row's text:", o["constrained_text"])

# %% [markdown]
# ## 2. A new request's grammar: cold, and from the cache
#
# Cold is what the first request with a spec pays: the schema turned into grammar text,
# validated against the tokenizer view, compiled into a matcher, and its first mask. From the
# cache, a request copies the compiled template and fills its first mask.

# %%
c = compile_costs(llm().core.grammars())
print(f"{c['schemas']} schemas: cold {c['cold_ms']:.2f} ms (max {c['cold_max_ms']:.2f}), "
      f"cached {c['cached_ms']:.3f} ms -> {c['saved']:.1f}x")

# %% [markdown]
# ## 3. The cache over a skewed stream
#
# 300 requests over 40 specs, spec i drawn with weight 1 / (i + 1), through a cache of 16
# templates. The backend's counters against the frozen LRU's prediction, and the first few
# decisions.

# %%
print(cache_counts())
lru = TemplateLRU(16)
print([lru.request(str(i)) for i in stream()[:12]])

# %% [markdown]
# ## 4. The vocabulary grows
#
# No 128k tokenizer ships in this repository, so the larger vocabularies are synthetic
# byte-level BPEs (the shipped tokenizer's tokens, then pairs of them). The fill barely moves
# with the vocabulary: the library walks a trie of token bytes and prunes whole subtrees the
# grammar cannot enter. The application is a pass over every logit of every constrained row, so
# it grows with V.

# %%
for v in vocab_costs([2048, 32768, 131072], steps=20):
    print(f"V={v['vocab']:>7,}: view built in {v['view_s']:.2f} s, fill {v['fill_ms']:.3f} ms")
for a in apply_costs([2048, 32768, 131072], repeats=20):
    op = f"{a['op_us']:.0f} us ({a['op_speedup']:.1f}x)" if "op_us" in a else "not loaded"
    print(f"V={a['vocab']:>7,}: apply PyTorch {a['torch_us']:.0f} us, C++ op {op}")
