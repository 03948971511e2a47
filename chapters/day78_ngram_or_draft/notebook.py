# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 78 notebook: prompt lookup against a draft model
#
# Prompt lookup finds the newest tokens earlier in the request and proposes what followed
# them; a draft model runs ahead of the target and proposes everywhere. This notebook runs
# lookup by hand on a toy sequence, replays it over a finished output, runs the shipped model
# with both proposers on one passage it trained on and one it never saw, and tabulates the
# formula that says what a proposal may cost. Nothing is timed; it runs in well under a minute
# on a CPU.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.day78_ngram_or_draft import claims
from chapters.day78_ngram_or_draft.snapshot.lookup import propose, replay
from chapters.day78_ngram_or_draft.snapshot.speedup import (
    break_even_a,
    expected_tokens,
    predicted_speedup,
)

# %% [markdown]
# ## 1. Lookup by hand
#
# The longest suffix (between the two bounds) that occurs earlier, its first occurrence, and
# the tokens after it. A sequence whose suffix never occurred before gets no proposal.

# %%
tokens = [1, 2, 3, 9, 7, 2, 3, 8, 7, 2, 3]  # [2, 3] first at 1; [7, 2, 3] first at 4
for lo, hi in ((2, 2), (3, 3), (2, 5)):
    print(f"lookup {lo} to {hi}: propose {propose(tokens, lo, hi, k=4)}")
print("nothing repeats:", propose([1, 2, 3, 4, 5], 2, 5, k=4))

# %% [markdown]
# ## 2. Replaying lookup over a finished output
#
# Greedy speculation never changes the tokens, so what lookup would have proposed and kept is
# fixed by the output alone. `replay` walks it as the engine does: the first token from the
# prefill, then one step at a time, each writing its kept proposals and one token of its own.

# %%
prompt = [5, 6, 7, 8, 9, 1, 2, 3, 5, 6]
output = [7, 8, 9, 1, 2, 3, 4, 4, 4, 4]
r = replay(prompt, output, 2, 2, k=4)
print(f"verify steps {r.drafts}, proposed {r.proposed}, kept {r.accepted}, per position "
      f"{r.per_pos}, decode steps {r.steps} for {len(output) - 1} tokens")

# %% [markdown]
# ## 3. The shipped model: a passage it trained on, one it never saw
#
# The chapter's workloads (six requests each), run with lookup and, where the draft_model
# proposer is built, with a draft of the shipped model's first layer. Each line: verify steps
# of decode steps, acceptance rate, mean acceptance length, tokens per target forward.

# %%
for arm in ("ngram", "draft"):
    if arm == "draft" and claims.draft_missing():
        print("draft:", claims.draft_missing())
        continue
    for w, name in claims.WORKLOADS.items():
        if arm == "draft" and w not in claims.DRAFT_WORKLOADS:
            continue
        f = claims.figures(arm, w)
        print(f"{arm:5s} {name:18s} {f['drafts']:3d} of {f['steps']:3d} steps, "
              f"rate {f['rate']:4.0%}, MAL {f['mal']:.2f}, {f['per_forward']:.2f} a forward, "
              f"kept by position {[round(s, 2) for s in f['pos_share']]}")
print("outputs equal to speculation off:", claims.identical("ngram"))

# %% [markdown]
# As text: of each passage workload, the request where lookup kept the most (by the replay),
# the prompt's tail, then what the model wrote. Where the model recites the document, its
# output is the passage again, and lookup proposes it from the prompt.

# %%
from nanoserve.tokenizer import Tokenizer

tok = Tokenizer.from_dir(str(claims.SHIPPED))
for w in ("train", "val"):
    pairs = list(zip(claims.prompts()[w], claims.run("ngram")[w]["outputs"], strict=True))
    kept = [replay(p, o, *claims.LOOKUP, k=claims.K).accepted for p, o in pairs]
    i = kept.index(max(kept))
    p, o = pairs[i]
    print(f"--- {claims.WORKLOADS[w]}, request {i}, {kept[i]} proposals kept: "
          f"...{tok.decode(p[-16:])!r}")
    print(f"    wrote {tok.decode(o)!r}")

# %% [markdown]
# ## 4. What a proposal may cost
#
# Expected tokens per verify step at acceptance rate `a`, and the predicted speed-up at a few
# draft costs `c`, for k = 4. The last column is the acceptance below which a draft of that
# cost slows decoding down. The third cost is the SmolLM2-135M first-layer draft's, from the
# weights a step reads.

# %%
k = claims.K
costs = (0.0, 0.05, claims.c_from_weights("smollm2"), 0.5, 1.0)
print("   a   tokens/step " + " ".join(f"c={c:<4.2f}" for c in costs))
for a in (0.1, 0.3, 0.5, 0.7, 0.9):
    row = " ".join(f"{predicted_speedup(a, k, c):6.2f}" for c in costs)
    print(f"{a:5.1f} {expected_tokens(a, k):8.2f}    {row}")
for c in costs[1:]:
    print(f"c = {c:.2f}: break-even acceptance {break_even_a(c, k):.0%}")
