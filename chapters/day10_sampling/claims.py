"""Day 10's numbers: what the sampler keeps, and that it draws from the distribution it claims."""

from __future__ import annotations

import torch

from chapters.runner import bound, exact

from .snapshot.sampling import SamplingParams, sample, top_k_mask, top_p_mask

DRAWS = 20_000


def kept_by_top_p() -> int:
    """probs (0.5, 0.3, 0.2), top_p = 0.6: the top token alone is short, the second crosses."""
    return int(top_p_mask(torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([0.6])).sum())


def _logits() -> torch.Tensor:
    return torch.randn(1, 32, generator=torch.Generator().manual_seed(10))


def _expected(temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The target distribution, computed directly and slowly, in vLLM's order: scale by the
    temperature, keep the top-k and renormalise, then keep the nucleus that reaches top_p."""
    p = (_logits()[0] / temperature).softmax(-1)
    order = p.argsort(descending=True).tolist()
    top = order[:top_k]
    total = float(p[top].sum())
    keep, mass = [], 0.0
    for i in top:
        if mass >= top_p:
            break
        keep.append(i)
        mass += float(p[i]) / total
    q = torch.zeros_like(p)
    q[keep] = p[keep]
    return q / q.sum()


def _draws(temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=1234)
    g = sp.make_generator()
    tokens = sample(_logits().expand(DRAWS, 32), [sp] * DRAWS, [g] * DRAWS)  # one batch
    return torch.bincount(tokens, minlength=32).float()


def total_variation() -> float:
    """Half the L1 distance between the empirical and the exact distribution."""
    counts = _draws(0.7, 8, 0.9)
    return 0.5 * float((counts / DRAWS - _expected(0.7, 8, 0.9)).abs().sum())


def draws_outside_nucleus() -> int:
    counts = _draws(0.7, 8, 0.9)
    return int(counts[_expected(0.7, 8, 0.9) == 0].sum())


def seeded_runs_agree() -> str:
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(3))
    runs = []
    for _ in range(2):
        sp = SamplingParams(temperature=1.0, top_p=0.95, seed=99)
        g = sp.make_generator()
        runs.append([int(sample(logits, [sp], [g])[0]) for _ in range(50)])
    return "identical" if runs[0] == runs[1] else "different"


def pipeline() -> dict:
    """The claims' row through the sampler's own pieces, one filter at a time (T=0.7, top_k=8,
    top_p=0.9): what each step leaves, as the text walks through it."""
    x = _logits()
    p1 = x.softmax(-1)
    t = x / 0.7
    pt = t.softmax(-1)
    k = top_k_mask(t, torch.tensor([8]))
    pk = t.masked_fill(~k, float("-inf")).softmax(-1)
    sorted_pk = pk.sort(-1, descending=True).values[0]
    kept = top_p_mask(pk, torch.tensor([0.9]))
    return {"top": (float(p1.max()), float(pt.max())), "held": float(pt[k].sum()),
            "top_k": float(pk.max()), "five_six": (float(sorted_pk[:5].sum()),
                                                    float(sorted_pk[:6].sum())),
            "nucleus": int(kept.sum())}


def wrong_reference() -> torch.Tensor:
    """The first reference's mistake, kept as a function: top-p measured on the tempered
    softmax over the whole vocabulary, before top-k renormalises."""
    p = (_logits()[0] / 0.7).softmax(-1)
    order = p.argsort(descending=True).tolist()
    keep, mass = [], 0.0
    for i in order[:8]:
        if mass >= 0.9:
            break
        keep.append(i)
        mass += float(p[i])
    q = torch.zeros_like(p)
    q[keep] = p[keep]
    return q / q.sum()


def wrong_order() -> str:
    """What the wrong reference gives ranks 7 and 8, and how far it is from the right one."""
    right, wrong = _expected(0.7, 8, 0.9), wrong_reference()
    ranks = wrong.argsort(descending=True)
    r7, r8 = (float(wrong[ranks[i]]) for i in (6, 7))
    return (f"ranks 7 and 8 at {r7:.1%} and {r8:.1%}; "
            f"{0.5 * float((right - wrong).abs().sum()):.4f} from the right distribution")


def noise(runs: int = 200) -> str:
    """Total variation of perfect draws: 20,000 tokens drawn from the exact distribution
    itself, ``runs`` seeded times; its mean and its largest value set the scale of the bound."""
    exact_p = _expected(0.7, 8, 0.9)
    g = torch.Generator().manual_seed(2024)
    tvs = []
    for _ in range(runs):
        counts = torch.bincount(torch.multinomial(exact_p, DRAWS, replacement=True,
                                                  generator=g), minlength=32).float()
        tvs.append(0.5 * float((counts / DRAWS - exact_p).abs().sum()))
    return f"mean {sum(tvs) / runs:.4f}, largest {max(tvs):.4f}"


def refused_settings() -> int:
    bad = [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.01}, {"top_k": -2},
           {"max_tokens": 0}, {"stop": [""]}]
    refused = 0
    for kwargs in bad:
        try:
            SamplingParams(**kwargs)
        except ValueError:
            refused += 1
    return refused


CLAIMS = [
    exact("tokens kept by top_p=0.6 over probabilities 0.5/0.3/0.2", kept_by_top_p,
          fmt="{} of 3".format),
    bound(f"total variation, {DRAWS:,} draws vs exact (T=0.7, top_k=8, top_p=0.9)",
          total_variation, fmt="{:.4f}".format),
    exact("draws outside the top-k/top-p set", draws_outside_nucleus),
    exact("two runs of 50 draws with seed=99", seeded_runs_agree),
    exact("out-of-range settings refused with a ValueError", refused_settings,
          fmt="{} of 6".format),
    exact("the claims' row: top token's probability at T=1, then at T=0.7",
          lambda: "{:.3f} -> {:.3f}".format(*pipeline()["top"])),
    exact("after top_k=8: tempered mass the survivors held; the top token renormalised",
          lambda: f"{pipeline()['held']:.3f}; {pipeline()['top_k']:.3f}"),
    exact("top_p=0.9 after top-k: mass of the top five, of the top six; tokens kept",
          lambda: "{:.3f}, {:.3f}; ".format(*pipeline()["five_six"])
          + str(pipeline()["nucleus"])),
    exact("the first, wrong reference (top-p before top-k renormalises)", wrong_order),
    exact(f"total variation of {DRAWS:,} perfect draws from the exact distribution, 200 "
          "seeded runs", noise),
]
