# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 10 notebook: what each filter keeps, and draws you can repeat
#
# On a CPU, in a few seconds:
#
# 1. `SamplingParams`: the defaults, and the settings it refuses at the door;
# 2. one real row of logits (the shipped nanoserve-tiny model's next-token scores for a short
#    prompt; a seeded random row if the checkpoint is not there) pushed through temperature,
#    top-k and top-p, printing what survives each step;
# 3. the token that crosses top_p, on the three-token example from the claims;
# 4. greedy, seeded and unseeded requests, alone and mixed in one batch;
# 5. a small version of the chapter's distribution check, on the real row.

# %%
import dataclasses
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__ and may
# start in the chapter folder) or from this file when it runs as a script.
_starts = [pathlib.Path.cwd()]
if "__file__" in globals():
    _starts.insert(0, pathlib.Path(__file__).resolve().parent)
ROOT = next(p for s in _starts for p in [s, *s.parents] if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.common import SHIPPED
from nanoserve.sampling.params import SamplingParams
from nanoserve.sampling.sampler import sample, top_k_mask, top_p_mask

torch.set_num_threads(2)

# %% [markdown]
# ## 1. The parameters
#
# The names and defaults are vLLM's, so a request written for vLLM means the same thing here.
# Temperature 1, top_p 1 and top_k 0 switch every filter off: the default is plain sampling
# from the model's distribution, and greedy decoding has to be asked for with temperature 0.

# %%
for f in dataclasses.fields(SamplingParams):
    print(f"{f.name:20s} default {f.default!r}")

# %%
bad = [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.01}, {"top_k": -2},
       {"max_tokens": 0}, {"stop": [""]}]
for kwargs in bad:
    try:
        SamplingParams(**kwargs)
        print(f"{kwargs!s:22s} accepted (!)")
    except ValueError as e:
        print(f"{kwargs!s:22s} ValueError: {e}")

# %% [markdown]
# ## 2. One real row of logits
#
# If the shipped model is present, the row is its prediction for the token after a prompt from
# its training domain (Python's reference manual). Its vocabulary has 2,048 entries.

# %%
PROMPT = "The for statement is used to"
decode = None
if (SHIPPED / "model.safetensors").is_file():
    from nanoserve.model.weights import load_model
    from nanoserve.tokenizer import Tokenizer

    model, tok = load_model(SHIPPED, "float32"), Tokenizer.from_dir(SHIPPED)
    ids = torch.tensor([tok.encode(PROMPT)])  # (1, T)
    with torch.no_grad():
        hidden = model(ids, torch.arange(ids.shape[1])[None])  # (1, T, E)
        row = model.compute_logits(hidden[:, -1])  # (1, V), float32
    decode = lambda i: repr(tok.decode([i]))  # noqa: E731
    print(f"nanoserve-tiny, prompt {PROMPT!r} ({ids.shape[1]} tokens)")
else:
    row = torch.randn(1, 2048, generator=torch.Generator().manual_seed(10)) * 3
    decode = lambda i: f"<{i}>"  # noqa: E731
    print(f"{SHIPPED} is missing (run `make train-tiny`); using a seeded random row instead")
print("logits row:", tuple(row.shape), row.dtype)


# %% [markdown]
# The four steps below are exactly the sampler's, in its order: divide by the temperature,
# mask everything outside the top k to -inf, softmax over what is left, and zero the tail
# beyond the nucleus. Each line reports how many tokens can still be drawn and the most likely
# few.

# %%
def show(label: str, probs: torch.Tensor, n: int = 6) -> None:
    alive = int((probs > 0).sum())
    top = probs.topk(n)
    shown = "  ".join(f"{decode(i)} {p:.3f}" for p, i in
                      zip(top.values.tolist(), top.indices.tolist(), strict=True))
    print(f"{label:30s} {alive:5d} drawable | {shown}")


T, K, P = 0.8, 40, 0.9
x = row / T  # (1, V)
show("softmax, raw", row[0].softmax(-1))
show(f"temperature {T}", x[0].softmax(-1))
x = x.masked_fill(~top_k_mask(x, torch.tensor([K])), float("-inf"))
probs = x.softmax(-1)  # renormalised over the k survivors
show(f"+ top_k {K}", probs[0])
nucleus = top_p_mask(probs, torch.tensor([P]))
final = probs.masked_fill(~nucleus, 0.0)
show(f"+ top_p {P}", (final / final.sum())[0])

sorted_p = probs[0].sort(descending=True).values
n = int(nucleus.sum())
print(f"\nthe nucleus holds {n} tokens: mass {sorted_p[:n - 1].sum():.4f} before the last one, "
      f"{sorted_p[:n].sum():.4f} with it (top_p = {P})")

# %% [markdown]
# A picture of the same row: the 20 most likely tokens after the temperature, and what top-k
# and top-p leave of them.

# %%
import matplotlib.pyplot as plt

# The book's palette (diagrams/style.py), spelled out: importing that module would switch
# matplotlib to Agg, and the site build needs the inline backend to capture this figure.
BLUE, GREY, ORANGE = "#2f6db5", "#7a7a7a", "#e8a33d"
tempered = (row / T)[0].softmax(-1)
after = (final / final.sum())[0]
order = tempered.argsort(descending=True)[:20]
ranks = torch.arange(1, 21).float()
fig, ax = plt.subplots(figsize=(8.5, 3.4))
ax.bar(ranks - 0.2, tempered[order], width=0.4, color=GREY, label=f"softmax(logits / {T})")
ax.bar(ranks + 0.2, after[order], width=0.4, color=BLUE,
       label=f"after top_k {K} and top_p {P}")
ax.bar(n + 0.2, after[order][n - 1], width=0.4, color=ORANGE,
       label="the token that crosses top_p")
ax.set_xticks(range(1, 21))
ax.set_xlabel("token, ranked by probability (the 20 likeliest)")
ax.set_ylabel("probability")
ax.set_title(f"nanoserve-tiny, the token after {PROMPT!r}"
             if (SHIPPED / "model.safetensors").is_file() else "a random row, before and after")
ax.legend(frameon=False)
fig.tight_layout()

# %% [markdown]
# ## 3. The token that crosses top_p is kept
#
# Probabilities 0.5, 0.3, 0.2. With top_p = 0.6 the first token alone (0.5) falls short, so
# the second one, which carries the mass across 0.6, is kept as well. The rule is "keep every
# token whose mass *before* it is still below top_p", which always keeps at least one token.

# %%
three = torch.tensor([[0.5, 0.3, 0.2]])
for p in (0.3, 0.5, 0.6, 0.75, 0.81, 1.0):
    kept = top_p_mask(three, torch.tensor([p]))[0].tolist()
    print(f"top_p {p:4}: keeps {sum(kept)} of 3  {kept}")

# %% [markdown]
# ## 4. Greedy, seeded, unseeded, and all three in one batch
#
# Temperature 0 is greedy: the argmax, with no generator made and no randomness consumed.
# A seeded request owns a `torch.Generator`, so its draws depend on its seed and nothing else;
# that is what makes a seeded request reproducible when other requests share its batch.

# %%
greedy = SamplingParams(temperature=0)
print("greedy makes a generator?", greedy.make_generator())
g_tok = int(sample(row, [greedy], [None])[0])
print(f"greedy token: {decode(g_tok)} (id {g_tok}); the argmax is id {int(row.argmax())}")


def run(params: list[SamplingParams], steps: int = 12) -> list[list[int]]:
    """Draw ``steps`` tokens for each request from the same row, as one batch per step."""
    gens = [sp.make_generator() for sp in params]
    batch = row.expand(len(params), -1)
    draws = [sample(batch, params, gens).tolist() for _ in range(steps)]
    return [list(col) for col in zip(*draws, strict=True)]


seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=99)
alone = run([seeded])[0]
again = run([seeded])[0]
crowd = run([SamplingParams(temperature=1.2), seeded, greedy, SamplingParams(top_k=5)])
for label, draws in (("seed=99 alone", alone), ("seed=99 alone, again", again),
                     ("seed=99 in a batch of 4", crowd[1]), ("its unseeded neighbour", crowd[0])):
    print(f"{label:24s}", " ".join(decode(t) for t in draws))
print("the seeded request drew the same tokens every time:", alone == again == crowd[1])

# %% [markdown]
# ## 5. Does the sampler draw from the distribution it claims?
#
# The chapter's claim does this on a 32-token row with 20,000 draws. Here is a smaller version
# on the real row: 5,000 draws, compared with the target distribution computed slowly, token by
# token, in the same order the sampler uses (temperature, top-k and renormalise, then top-p).

# %%
def expected(logits: torch.Tensor, t: float, k: int, p: float) -> torch.Tensor:
    probs = (logits / t).softmax(-1)
    top = probs.argsort(descending=True).tolist()[:k]
    total = float(probs[top].sum())
    keep, mass = [], 0.0
    for i in top:
        if mass >= p:
            break
        keep.append(i)
        mass += float(probs[i]) / total
    q = torch.zeros_like(probs)
    q[keep] = probs[keep]
    return q / q.sum()


N = 5_000
sp = SamplingParams(temperature=T, top_k=K, top_p=P, seed=0)
g = sp.make_generator()
tokens = sample(row.expand(N, -1), [sp] * N, [g] * N)
freq = torch.bincount(tokens, minlength=row.shape[-1]).float() / N
want = expected(row[0], T, K, P)
print(f"total variation over {N:,} draws: {0.5 * float((freq - want).abs().sum()):.4f}")
# What pure sampling noise gives on average: E|freq - p| is about sqrt(2 p (1 - p) / (pi N)).
noise = 0.5 * float((2 * want * (1 - want) / (torch.pi * N)).sqrt().sum())
print(f"typical distance from noise alone:  {noise:.4f}")
print("draws outside the nucleus:", int((freq[want == 0] > 0).sum()))
