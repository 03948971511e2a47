"""Day 77's figure: why a rejection sampler emits exactly the target's distribution.

    python chapters/day77_rejection_sampler/diagram.py

writes build/figures/day77_rejection_sampler/residual.png, three panels over the six-token
vocabulary of the chapter's experiment (``claims.P`` and ``claims.Q``):

- the target ``p`` and the draft ``q`` side by side;
- ``p`` cut in two: ``min(p, q)``, the mass that arrives as a kept proposal, and
  ``max(0, p - q)``, the residual the target draws from after a rejection; the two stack to
  ``p`` exactly, and ``q`` is drawn as an outline for comparison;
- the same cut for an n-gram proposal of token 2, a ``q`` that is a point mass: only ``p(2)``
  can arrive as a kept proposal, and the residual is ``p`` with token 2 removed.

Nothing is measured; the bars are the snapshot's ``acceptance_rate`` and ``residual``.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from chapters.day77_rejection_sampler.claims import NGRAM_TOKEN, tensors  # noqa: E402
from chapters.day77_rejection_sampler.snapshot import rejection as rj  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def split(ax, p: torch.Tensor, q: torch.Tensor, title: str) -> None:
    x = torch.arange(p.numel())
    kept, rest = torch.minimum(p, q), rj.residual(p, q)
    ax.bar(x, kept, color=COLORS["compute"], label="min(p, q): a kept proposal")
    ax.bar(x, rest, bottom=kept, color=COLORS["highlight"],
           label="max(0, p - q): drawn after a rejection")
    ax.step(torch.cat([x - 0.5, x[-1:] + 0.5]), torch.cat([q, q[-1:]]), where="post",
            color=COLORS["reference"], linewidth=1.2, linestyle="--", label="q")
    a = float(rj.acceptance_rate(p, q))
    ax.set_title(f"{title}\nkept {a:.2f}, residual {1 - a:.2f}", fontsize=11)
    ax.set_xticks(x.tolist())
    ax.set_xlabel("token")


def main() -> None:
    p, q = tensors()
    fig, axes = figure(width=12, height=4.2, ncols=3, sharey=True)
    x = torch.arange(p.numel())
    axes[0].bar(x - 0.2, p, width=0.4, color=COLORS["ink"], label="p: the target")
    axes[0].bar(x + 0.2, q, width=0.4, color=COLORS["reference"], label="q: the draft")
    axes[0].set_title("target and draft", fontsize=11)
    axes[0].set_xticks(x.tolist())
    axes[0].set_xlabel("token")
    axes[0].set_ylabel("probability")
    axes[0].legend(fontsize=8)
    split(axes[1], p, q, "a draft model's q")
    axes[1].legend(fontsize=8, loc="upper right")
    split(axes[2], p, rj.point_mass(torch.tensor(NGRAM_TOKEN), p.numel(), p.dtype),
          f"an n-gram guess: q = 1 on token {NGRAM_TOKEN}")
    axes[2].set_ylim(0, 0.42)  # the point mass at 1 would flatten the bars
    fig.suptitle("p = min(p, q) + max(0, p - q): the kept mass plus the residual",
                 fontsize=12, fontweight="bold", y=1.04)
    save(fig, __file__, "residual")


if __name__ == "__main__":
    main()
