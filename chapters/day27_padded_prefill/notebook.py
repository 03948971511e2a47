# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 27 notebook: four prompts, one forward
#
# On a CPU, in a few seconds, with the live package and the shipped nanoserve-tiny model:
#
# 1. four prompts of 5, 17, 1 and 9 tokens, right-padded into one (4, 17) batch, with the ids,
#    positions and write cells the engine builds for them;
# 2. `Engine.prefill` on that batch, held against one plain forward per prompt;
# 3. the attention mask one short row sees, padding included;
# 4. a row that already has tokens cached, prefilled beside a fresh one: positions start where
#    each row's cache ends;
# 5. what the padding costs, counted and timed.

# %%
import pathlib
import sys
import time

# The repository root, from the working directory (a Jupyter kernel has no __file__ and may
# start in the chapter folder).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from nanoserve.engine.engine import Engine
from nanoserve.model.weights import load_model
from nanoserve.testing import relative_logit_error
from nanoserve.tokenizer import Tokenizer

torch.set_num_threads(2)
SHIPPED = ROOT / "nanoserve" / "checkpoints" / "nanoserve-tiny"
model = load_model(SHIPPED, "float32")
tok = Tokenizer.from_dir(SHIPPED)
print(f"nanoserve-tiny: {model.num_parameters():,} parameters, "
      f"{model.cfg.num_hidden_layers} layers, vocab {model.cfg.vocab_size}")

# %% [markdown]
# ## 1. A ragged batch, padded
#
# The chapter's claims use four prompts of 5, 17, 1 and 9 tokens. Here they are cut from one
# sentence of the model's training domain (Python's reference manual), so that they are real
# text. The engine right-pads them to the longest: a (4, 17) grid of ids, and beside it a grid
# of positions. A real token sits at the position it has in its own sequence; padding gets id 0
# and position 0.

# %%
TEXT = ("The for statement is used to iterate over the elements of a sequence (such as a "
        "string, tuple or list) or other iterable object, and the else clause is executed "
        "when the loop terminates")
words = tok.encode(TEXT, add_special_tokens=False)  # 41 tokens, no BOS
LENGTHS = [5, 17, 1, 9]
prompts = [words[i:i + n] for i, n in zip([0, 9, 0, 29], LENGTHS, strict=True)]
for p in prompts:
    print(f"{len(p):2d} tokens  {tok.decode(p)!r}")

B, T = len(prompts), max(LENGTHS)
ids = torch.zeros(B, T, dtype=torch.long)  # (B, T), right-padded
pos = torch.zeros(B, T, dtype=torch.long)  # (B, T), padding at position 0
for b, p in enumerate(prompts):
    ids[b, :len(p)] = torch.tensor(p)
    pos[b, :len(p)] = torch.arange(len(p))
print("\nids (B, T) =", tuple(ids.shape))
print(ids)
print("positions")
print(pos)

# %% [markdown]
# Where does each token's K/V go? The engine asks the cache: `begin_step(rows, lens)` turns
# each row's block table into pool cells for its new tokens, and writes -1 for padding, which
# the attention layer skips when it stores K/V. Here we build a throwaway engine with
# block_size 4, give each row the blocks its prompt needs, and look at the layout.

# %%
probe = Engine(model, num_kv_blocks=32, block_size=4, max_num_seqs=4, max_model_len=64,
               prefill="padded", attention="reference")
rows = [0, 1, 2, 3]
for row, n in zip(rows, LENGTHS, strict=True):
    probe.grant(row, n)
    print(f"row {row}: {n:2d} tokens -> blocks {probe.cache.tables[row].blocks}")
layout = probe.cache.begin_step(rows, LENGTHS)
print("\nwrite cells (B, T), -1 = padding, writes nothing")
print(layout.write_cells)
print("context lengths after the step:", layout.context_lens.tolist())
print("read cells (B, S):", tuple(layout.read_cells.shape))
probe.cache.end_step()

# %% [markdown]
# ## 2. One padded forward against four plain ones
#
# `Engine.prefill(rows, prompts)` does the padding above, runs the model once over the paged
# cache, and reads each row back at its *own* last real token (column `len - 1`, not column
# 16). The reference is the plain causal forward of Day 1, one prompt at a time, no cache.

# %%
engine = Engine(model, num_kv_blocks=64, block_size=4, max_num_seqs=4, max_model_len=256,
                prefill="padded", attention="reference")
for row, n in zip(rows, LENGTHS, strict=True):
    engine.grant(row, n + 8)  # room for a few decode steps later
with torch.inference_mode():
    batched = engine.prefill(rows, prompts)  # (B, V)
    print("batched logits (B, V) =", tuple(batched.shape),
          f"in {engine.forward_passes} forward pass")
    worst = 0.0
    for b, p in enumerate(prompts):
        h = model(torch.tensor([p]), torch.arange(len(p))[None])  # (1, T_b, E)
        alone = model.compute_logits(h[0, -1])  # (V,)
        err = relative_logit_error(batched[b], alone)
        worst = max(worst, err)
        print(f"row {b} ({len(p):2d} tokens): relative difference {err:.2e}, next token "
              f"{tok.decode([int(batched[b].argmax())])!r} vs "
              f"{tok.decode([int(alone.argmax())])!r}")
print(f"worst {worst:.2e} (the claim's bound is 1e-5)")
print("cached lengths now:", engine.cache.lengths)

# %% [markdown]
# ## 3. The mask a short row sees
#
# Inside attention every row gathers its context into a (B, S) rectangle, S = 17 here, and one
# mask rule covers causality, the ragged lengths and the padding at once:
# key j is visible to a query iff `j <= query position` and `j < the row's context length`.
# For the 5-token row, queries 0-4 are its tokens; queries 5-16 are padding at position 0, so
# each of them sees key 0 only. Their outputs are computed and thrown away, but no mask row is
# ever empty, so no NaN can appear.

# %%
S = max(LENGTHS)
j = torch.arange(S)
q_pos = pos[0]  # the 5-token row
mask = (j[None, :] <= q_pos[:, None]) & (j[None, :] < LENGTHS[0])  # (T, S)
for t in range(T):
    kind = "token  " if t < LENGTHS[0] else "padding"
    print(f"query {t:2d} ({kind}, pos {int(q_pos[t])}): "
          + "".join("#" if m else "." for m in mask[t].tolist()))

# %% [markdown]
# ## 4. Positions start where the cache ends
#
# Nothing above needs a row to start empty. Below, row 0 first receives the first 6 tokens of
# a prompt, alone; then one padded forward carries its remaining 11 tokens beside a fresh
# 3-token prompt in row 1. Row 0's new tokens sit at positions 6-16, row 1's at 0-2, and both
# rows' last logits match plain forwards over their whole sequences.

# %%
long, short = words[:17], words[35:38]
e2 = Engine(model, num_kv_blocks=32, block_size=4, max_num_seqs=2, max_model_len=64,
            prefill="padded", attention="reference")
e2.grant(0, len(long))
e2.grant(1, len(short))
with torch.inference_mode():
    e2.prefill([0], [long[:6]])
    print("row 0 cached:", e2.cache.lengths[0], "tokens")
    layout_pos = [list(range(e2.cache.lengths[0], e2.cache.lengths[0] + 11)), [0, 1, 2]]
    print("positions of the next step:", layout_pos)
    out = e2.prefill([0, 1], [long[6:], short])  # (2, V)
    for b, seq in enumerate([long, short]):
        ref = model.compute_logits(model(torch.tensor([seq]),
                                         torch.arange(len(seq))[None])[0, -1])
        print(f"row {b}: relative difference {relative_logit_error(out[b], ref):.2e}")

# %% [markdown]
# ## 5. What the padding costs
#
# The first line below counts the grid: every position in it, real or padding, goes through
# every matmul of the model. Against that, one forward replaces four, and on a model this small
# the fixed cost of a forward (Python, operator dispatch, one pass over the weights) is a large
# share of it. Which effect wins is a matter of measurement: below, this machine,
# nanoserve-tiny, best of ten with the two variants interleaved. The ratio moves from run to
# run on a shared machine, so read it as this run's, not as a constant.

# %%
real = sum(LENGTHS)
print(f"positions {B * T}, real {real}, padding {B * T - real} ({1 - real / (B * T):.1%})")


timer = Engine(model, num_kv_blocks=32, block_size=4, max_num_seqs=4, max_model_len=64,
               prefill="padded", attention="reference")


def timed(padded: bool) -> float:
    """One prefill of the four prompts, padded or one at a time; rows released afterwards."""
    for row, n in zip(rows, LENGTHS, strict=True):
        timer.grant(row, n)
    t0 = time.perf_counter()
    if padded:
        timer.prefill(rows, prompts)
    else:
        for row, p in zip(rows, prompts, strict=True):
            timer.prefill([row], [p])
    elapsed = time.perf_counter() - t0
    for row in rows:
        timer.release(row)
    return elapsed


with torch.inference_mode():
    runs = [(timed(True), timed(False)) for _ in range(10)]  # interleaved, so load hits both
t_pad, t_one = min(r[0] for r in runs), min(r[1] for r in runs)
print(f"one padded forward: {t_pad * 1e3:.1f} ms; four forwards: {t_one * 1e3:.1f} ms "
      f"({t_one / t_pad:.1f}x)")


# %% [markdown]
# The padding share grows with the spread of lengths, not their size: the same four prompts
# sorted into two pairs of similar length would pad far less. A scheduler that picks which
# prompts to prefill together can use that; Day 27 only makes the mixed batch correct.

# %%
for lens in ([5, 17, 1, 9], [16, 17, 15, 17], [1, 1, 1, 200]):
    grid = len(lens) * max(lens)
    print(f"lengths {lens}: grid {len(lens)} x {max(lens)} = {grid}, "
          f"padding {1 - sum(lens) / grid:.1%}")
