# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Day 7 notebook: the KV cache, measured
#
# The same prompt, the same greedy decoding, the same shipped model (nanoserve-tiny), run twice:
# once recomputing the whole sequence at every step (`enable_kv_cache=False`, Day 4's loop) and
# once with a KV cache. We count the token positions each run pushes through the model, time
# both, check the replies are the same tokens, and then open Day 7's contiguous `KVCache` up to
# look at its tensors and at the mask that lets a chunk of queries start part-way into the
# sequence.
#
# One note on today's package: `LLM()` now keeps its cache in the paged pool of later chapters
# rather than in Day 7's rectangle. The work it does per step is the same (the prompt once, then
# one token per step), so the counts below are Day 7's counts.

# %%
import pathlib
import sys
import time

ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.attention.causal import causal_attention
from nanoserve.attention.kv_cache import KVCache

torch.manual_seed(0)
torch.set_num_threads(1)  # timings on one thread, as the chapter's claim takes them: steadier
cached = LLM(dtype="float32", enable_kv_cache=True)
uncached = LLM(dtype="float32", enable_kv_cache=False)
cfg = cached.config
print(f"nanoserve-tiny: {cached.model.num_parameters():,} parameters, "
      f"{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads / "
      f"{cfg.num_key_value_heads} KV heads, head_dim {cfg.head_dim}, "
      f"dtype {cached.model.embed_tokens.weight.dtype}")

# %% [markdown]
# ## The same reply, two amounts of work
#
# Greedy decoding (`temperature=0`) with `ignore_eos=True`, so both runs produce exactly `N`
# tokens and the counts can be checked against the formulas: without a cache step `i` runs all
# `P + i` tokens, `N·P + N(N−1)/2` in total; with the cache the prompt runs once and each later
# step runs one token, `P + N − 1` in total.

# %%
prompt = "The with statement is used to wrap the execution of a block"
N = 64
params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)


def run(llm: LLM) -> tuple[object, int, int, float]:
    """One generation: the output, token-forwards, model forwards and the wall time."""
    before = (llm.stats.tokens_computed, llm.stats.forward_passes)
    t0 = time.perf_counter()
    out = llm.generate(prompt, params)[0]
    wall = time.perf_counter() - t0
    return out, llm.stats.tokens_computed - before[0], llm.stats.forward_passes - before[1], wall


out_c, work_c, calls_c, t_c = run(cached)
out_u, work_u, calls_u, t_u = run(uncached)
P = len(out_c.prompt_token_ids)
print(f"prompt: {P} tokens (BOS included), {N} new tokens\n")
print(f"{'':>10} {'forwards':>9} {'token-forwards':>15} {'formula':>8} {'wall':>9}")
print(f"{'no cache':>10} {calls_u:>9} {work_u:>15,} {N * P + N * (N - 1) // 2:>8,} "
      f"{t_u * 1e3:>7.0f}ms")
print(f"{'KV cache':>10} {calls_c:>9} {work_c:>15,} {P + N - 1:>8,} {t_c * 1e3:>7.0f}ms")
print(f"\nwork removed: {work_u / work_c:.1f}x")
print("identical tokens:", out_c.token_ids == out_u.token_ids)
print("identical text:  ", out_c.text == out_u.text)

# %% [markdown]
# The reply itself. The model is small and was trained on little text (Python's help pages), so
# from a prompt that opens one of those pages it mostly recites what it memorised:

# %%
print(prompt + out_c.text)

# %% [markdown]
# ## Day 7's loop, timed
#
# The wall times above are not a Day 7 comparison. `LLM()`'s cached path now runs through the
# scheduler and the paged cache of later chapters, whose reference attention gathers every
# cached key through a slot table at every step; on a model this small that gather costs about
# as much as the recomputation it saves. To time what this chapter built, here is Day 7's
# generation loop written out over the contiguous `KVCache`, next to Day 4's recompute loop, on
# the same weights, for a 16-token prompt and 128 new tokens. (The chapter's speed-up claim runs
# the frozen snapshot of these loops for 256 new tokens on one thread; `make chapter-7` measures
# it.)

# %%
def generate_uncached(model, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        h = model(torch.tensor([seq]), torch.arange(len(seq))[None])  # (1, T, E), all again
        seq.append(int(model.compute_logits(h[0, -1]).argmax()))
    return seq[len(ids):]


def generate_cached(model, ids: list[int], n: int) -> list[int]:
    cache = KVCache.for_model(model, batch=1, max_len=len(ids) + n)
    step, out = list(ids), []
    for _ in range(n):
        pos = torch.arange(cache.length, cache.length + len(step))[None]  # (1, T)
        h = model(torch.tensor([step]), pos, cache)  # prefill: T = P; decode: T = 1
        cache.advance(len(step))
        out.append(int(model.compute_logits(h[0, -1]).argmax()))
        step = [out[-1]]
    return out


def best_of_two(fn, *args) -> tuple[list[int], float]:
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        result = fn(*args)
        times.append(time.perf_counter() - t0)
    return result, min(times)


model = cached.model
ids16 = list(range(2, 18))
with torch.inference_mode():
    toks_u, t_u = best_of_two(generate_uncached, model, ids16, 128)
    toks_c, t_c = best_of_two(generate_cached, model, ids16, 128)
print(f"no cache: {t_u * 1e3:6.0f} ms   contiguous KV cache: {t_c * 1e3:6.0f} ms   "
      f"speed-up {t_u / t_c:.1f}x   same tokens: {toks_u == toks_c}")

# %% [markdown]
# The wall-clock ratio is far smaller than the work ratio. A forward has a fixed cost that does
# not depend on how many tokens it carries (Python, one small kernel call per operation, reading
# every weight once), and on a model of a few million parameters that fixed cost is a large part
# of a one-token step. Timing single forwards of different lengths shows it:

# %%
def forward_ms(model, lengths: list[int], rounds: int = 8) -> dict[int, float]:
    """Fastest time of one forward per length, the lengths interleaved round by round."""
    inputs = {T: (torch.randint(2, 1000, (1, T)), torch.arange(T)[None]) for T in lengths}
    best = dict.fromkeys(lengths, float("inf"))
    with torch.inference_mode():
        for _ in range(rounds):
            for T, (x, pos) in inputs.items():
                t0 = time.perf_counter()
                model(x, pos)
                best[T] = min(best[T], time.perf_counter() - t0)
    return {T: t * 1e3 for T, t in best.items()}


ms = forward_ms(model, [1, 16, 64, 128])
for T, t in ms.items():
    print(f"forward over {T:>3} tokens: {t:6.2f} ms "
          f"({t / ms[1]:4.1f}x the time for {T}x the tokens)")

# %% [markdown]
# The token count is exact; the time depends on the machine, on how long the reply is (the
# uncached cost grows quadratically, so the ratio rises with `N`), and on what else the machine
# is doing.
#
# How the two counts grow with the reply length, counted by the engine's own `stats`:

# %%
lengths = [8, 16, 32, 64, 96]
counts = {"no cache": [], "KV cache": []}
for n in lengths:
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    for name, llm in (("no cache", uncached), ("KV cache", cached)):
        before = llm.stats.tokens_computed
        llm.generate(prompt, sp)
        counts[name].append(llm.stats.tokens_computed - before)
for n, u, c in zip(lengths, counts["no cache"], counts["KV cache"], strict=True):
    assert u == n * P + n * (n - 1) // 2 and c == P + n - 1
    print(f"N={n:>3}: no cache {u:>6,}   KV cache {c:>4}   ratio {u / c:5.1f}x")

fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(lengths, counts["no cache"], "o-", color="#d1495b", label="no cache (quadratic)")
ax.plot(lengths, counts["KV cache"], "o-", color="#2f6db5", label="KV cache (linear)")
ax.set_xlabel("new tokens N")
ax.set_ylabel("token-forwards")
ax.legend()
plt.show()

# %% [markdown]
# ## Inside the cache
#
# `KVCache.for_model` allocates two tensors, K and V, each `(L, B, Hkv, Tmax, D)`: layers, batch
# rows, KV heads, reserved positions, head dimension. We step the loop above by hand: prefill
# the prompt in one forward, then decode two tokens, and watch `length` move while the shape
# stays put.

# %%
ids = out_c.prompt_token_ids
cache = KVCache.for_model(model, batch=1, max_len=P + N)
print("K:", tuple(cache.k.shape), " V:", tuple(cache.v.shape), "  # (L, B, Hkv, Tmax, D)")
print(f"reserved: {cache.nbytes():,} bytes for {cache.max_len} positions "
      f"({cache.nbytes() // cache.max_len:,} bytes per token)")

with torch.inference_mode():
    h = model(torch.tensor([ids]), torch.arange(P)[None], cache)  # prefill: (1, P, E)
    cache.advance(P)
    tokens = [int(model.compute_logits(h[0, -1]).argmax())]
    print(f"after prefill: hidden {tuple(h.shape)}, cache.length = {cache.length}")
    for _ in range(2):
        pos = cache.length
        h = model(torch.tensor([[tokens[-1]]]), torch.tensor([[pos]]), cache)  # (1, 1, E)
        cache.advance(1)
        tokens.append(int(model.compute_logits(h[0, -1]).argmax()))
        print(f"after decode:  hidden {tuple(h.shape)}, cache.length = {cache.length}")

written = cache.k[:, :, :, :cache.length]
unused = cache.k[:, :, :, cache.length:]
print(f"\npositions written: {written.shape[3]}, nonzero: {bool(written.abs().sum() > 0)}")
print(f"positions reserved but unused: {unused.shape[3]}, all zero: "
      f"{bool(unused.abs().sum() == 0)}")
print("hand-driven tokens match the engine's first three:", tokens == out_c.token_ids[:3])

# %% [markdown]
# ## The offset causal mask
#
# With no cache, queries and keys cover the same positions and the mask is the usual lower
# triangle. With a cache, a forward carries `T` new queries that start at absolute position
# `q_offset` and attend over `S = q_offset + T` keys. Query `i` may see keys `0 .. q_offset + i`.
# For a decode step (`T = 1`) that is every key; for a chunk of several tokens it is a triangle
# shifted right by `q_offset`:

# %%
T, q_offset = 3, 5
S = q_offset + T
mask = torch.arange(S)[None, :] <= (q_offset + torch.arange(T)[:, None])  # (T, S)
print(f"T={T} queries at positions {q_offset}..{q_offset + T - 1}, S={S} keys")
for i, row in enumerate(mask.int().tolist()):
    print(f"  query at {q_offset + i}:", " ".join(map(str, row)))

# %% [markdown]
# The mask is what makes a cached forward agree with an uncached one. A direct check: attention
# for the last three queries over eight keys, computed with the offset mask, equals the last
# three rows of full causal attention over all eight.

# %%
g = torch.Generator().manual_seed(0)
q = torch.randn(1, 4, S, 8, generator=g)  # (B, Hq, S, D)
k = torch.randn(1, 2, S, 8, generator=g)  # (B, Hkv, S, D)
v = torch.randn(1, 2, S, 8, generator=g)
full = causal_attention(q, k, v)  # every query, q_offset 0
tail = causal_attention(q[:, :, q_offset:], k, v, q_offset=q_offset)  # the last T queries
print("max |difference|:", (full[:, :, q_offset:] - tail).abs().max().item())

# %% [markdown]
# The same property lets the prompt itself be prefilled in pieces. Splitting the prompt into two
# chunks gives the same final hidden state as one forward over all of it:

# %%
with torch.inference_mode():
    one = KVCache.for_model(model, 1, P)
    h_one = model(torch.tensor([ids]), torch.arange(P)[None], one)
    two = KVCache.for_model(model, 1, P)
    cut = P // 2
    model(torch.tensor([ids[:cut]]), torch.arange(cut)[None], two)
    two.advance(cut)
    h_two = model(torch.tensor([ids[cut:]]), torch.arange(cut, P)[None], two)
print("last hidden state, one chunk vs two: max |difference| =",
      f"{(h_one[0, -1] - h_two[0, -1]).abs().max().item():.2e}")

# %% [markdown]
# ## What a contiguous cache costs
#
# Bytes per token are `2 (K and V) × layers × KV heads × head_dim × bytes per value`. For the
# shipped model in fp32 that is small. For the shape of Llama-3.2-1B in bf16 it is much larger,
# and a cache that reserves the full 131,072-token context for one sequence holds all of it
# whether the sequence uses it or not; the cell below prints both.

# %%
def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, nbytes: int) -> int:
    return 2 * layers * kv_heads * head_dim * nbytes


tiny = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4)
llama = kv_bytes_per_token(16, 8, 64, 2)
print(f"nanoserve-tiny, fp32: {tiny:,} bytes per token")
print(f"Llama-3.2-1B shape, bf16: {llama // 1024} KiB per token; "
      f"131,072 tokens reserved: {llama * 131072 / 2**30:.1f} GiB")
used = 500
print(f"a sequence that stops at {used} tokens writes {llama * used / 2**20:.1f} MiB of it: "
      f"{used / 131072:.2%} of the reservation")

# %% [markdown]
# And the price of reading: every decode step attends over every cached position, so the bytes
# of K and V it reads grow with the sequence, while the arithmetic per step stays one token's
# worth. For the 1B shape:

# %%
for length in (128, 1024, 8192, 131072):
    print(f"decode at position {length:>7,}: reads {llama * length / 2**20:>8.1f} MiB of K/V")
