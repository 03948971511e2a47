# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 77 notebook: the rejection sampler
#
# A verify step hands the rejection sampler the target's distribution at every speculative
# position. Greedy requests keep proposals while they equal the argmax; sampled requests keep a
# proposal `d` with probability `min(1, p(d)/q(d))` and, after a refusal, draw from
# `max(0, p - q)` normalised. This notebook walks one step by hand, checks the algebra that makes
# the output exactly `p`, runs the chapter's experiment and its two broken rules, and calls the
# engine's `verify` on one request. It runs in seconds on a CPU.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import torch

from chapters.day77_rejection_sampler import claims
from chapters.day77_rejection_sampler.snapshot import rejection as rj

p, q = claims.tensors()
print("p =", p.tolist())
print("q =", q.tolist())

# %% [markdown]
# ## 1. Greedy verification
#
# The argmax of each row against the proposals: keep while they match, then the target's own
# token; when all match, the last row's argmax is a bonus.

# %%
best = [5, 2, 7, 1]
for drafts in ([5, 2, 3], [5, 2, 7], [4, 2, 7]):
    print(f"argmax {best}, proposals {drafts} -> emit {rj.greedy_verify(best, drafts)}")

# %% [markdown]
# ## 2. The algebra, token by token
#
# `P(emit x)` is the kept part `q(x) min(1, p(x)/q(x))` plus the refusal chance times the
# residual's share of `x`. Computed for each token, it is `p` again.

# %%
kept = q * torch.clamp(p / q, max=1.0)
refused = 1 - rj.acceptance_rate(p, q)
res = rj.residual(p, q)
emit = kept + refused * res / res.sum()
print("kept part      ", [round(x, 4) for x in kept.tolist()])
print("residual share ", [round(x, 4) for x in (res / res.sum()).tolist()])
print("P(emit x)      ", [round(x, 4) for x in emit.tolist()])
print("largest |P(emit x) - p(x)|:", float((emit - p).abs().max()))
print("acceptance rate sum min(p, q):", round(float(rj.acceptance_rate(p, q)), 4))

# %% [markdown]
# ## 3. One step, by hand
#
# Four proposals drawn from `q`, four uniforms for the tests and one for the target's draw.
# The step keeps the leading run of proposals that pass, then emits the target's token.

# %%
g = torch.Generator().manual_seed(6)
k, V = claims.K, p.numel()
drafts = rj.draw(q.expand(k, V), torch.rand(k, generator=g, dtype=torch.float64))
u = torch.rand(1, k, generator=g, dtype=torch.float64)
v = torch.rand(1, generator=g, dtype=torch.float64)
for j, d in enumerate(drafts.tolist()):
    ratio = float(p[d] / q[d])
    keep = float(u[0, j]) < ratio
    print(f"position {j}: proposal {d}, p/q = {ratio:.3f}, u = {float(u[0, j]):.3f} -> "
          f"{'keep' if keep else 'refuse: the rest are not judged'}")
    if not keep:
        print("  residual max(0, p - q) normalised:",
              [round(x, 4) for x in (rj.residual(p, q) / rj.residual(p, q).sum()).tolist()])
        break
tokens, a = rj.rejection_sample(p.expand(1, k + 1, V), q.expand(1, k, V), drafts[None], u, v)
print("emitted:", [t for t in tokens[0].tolist() if t >= 0], "accepted:", int(a))

# %% [markdown]
# ## 4. The experiment
#
# The chapter's many seeded steps in one vectorised call: the first emitted token's counts
# against `p`, for the right rule and for the two broken ones (after a refusal, a draw from `p`
# or from `q`). Then the acceptance rate, tokens per step, the n-gram case and the Markov chain.

# %%
for rule in claims.BROKEN:
    stat, dof, pval = claims.first_token_test(rule)
    counts = torch.bincount(claims.steps(rule)[0][:, 0], minlength=V)
    share = (counts / counts.sum()).tolist()
    print(f"after a refusal draw from {rule:14s} first-token shares "
          f"{[round(x, 3) for x in share]}  chi-square {stat:,.2f} ({dof} dof), p = {pval:.3g}")
print("target p:", p.tolist())
print(f"acceptance: measured {claims.measured_acceptance():.4f}, "
      f"exact {claims.exact_acceptance():.4f}")
print(f"tokens per step: measured {claims.mean_tokens():.3f}, "
      f"formula {claims.formula_tokens():.3f}")
print(f"n-gram guess {claims.NGRAM_TOKEN}: acceptance {claims.measured_acceptance('ngram'):.4f}"
      f", p-value {claims.first_token_test(proposer='ngram')[2]:.3f}")
print("Markov chain, first two tokens: chi-square {:.2f} ({} dof), p = {:.3f}".format(
    *claims.sequence_test()))

# %% [markdown]
# ## 5. The engine's verify on one request
#
# A sampled request with two proposals and the draft's probabilities: the engine's verdict and
# the snapshot's, given the same seed.

# %%
from nanoserve.sampling.params import SamplingParams  # noqa: E402
from nanoserve.spec_decode.rejection import verify  # noqa: E402

logits = p.float().log().expand(3, V).clone()
draft_q = q.float().expand(2, V).clone()
for seed in range(4):
    r = claims._request(0, SamplingParams(temperature=1.0, seed=seed), [], [1, 2], draft_q)
    verdict = verify(logits, [r])[0]
    print(f"seed {seed}: engine {verdict.tokens}, snapshot "
          f"{list(claims.snapshot_verdict(logits, r, seed)[0])}")
