"""Day 10's figures: one distribution through the sampler, and 20,000 draws against the truth.

    python chapters/day10_sampling/diagram.py

writes build/figures/day10_sampling/pipeline.png and draws.png. Both use the same 32 logits as
the chapter's claims (``torch.randn(32)`` seeded with 10) and the same settings (temperature 0.7,
top_k 8, top_p 0.9), and the frozen Day 10 sampler.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from chapters.day10_sampling.claims import DRAWS, _draws, _expected, _logits  # noqa: E402
from chapters.day10_sampling.snapshot.sampling import top_k_mask, top_p_mask  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

T, K, P = 0.7, 8, 0.9


def stages() -> tuple[torch.Tensor, list[tuple[str, torch.Tensor, torch.Tensor]], int]:
    """Each stage's probabilities and keep-mask, with tokens sorted by their raw probability."""
    logits = _logits()[0]
    order = logits.argsort(descending=True)
    logits = logits[order]                                            # rank 1 first
    raw = logits.softmax(-1)
    tempered = (logits / T).softmax(-1)
    keep_k = top_k_mask((logits / T)[None], torch.tensor([K]))[0]
    after_k = (logits / T).masked_fill(~keep_k, float("-inf")).softmax(-1)
    keep_p = top_p_mask(after_k[None], torch.tensor([P]))[0]
    final = after_k * keep_p
    final = final / final.sum()
    crossing = int(keep_p.sum()) - 1                                  # index of the last kept
    everyone = torch.ones_like(keep_k)
    return order, [
        ("1. softmax of the raw logits", raw, everyone),
        (f"2. temperature {T}: softmax(logits / {T})", tempered, everyone),
        (f"3. top_k = {K}: the rest to -inf, softmax again", after_k, keep_k),
        (f"4. top_p = {P}: keep the nucleus, renormalise", final, keep_p),
    ], crossing


def pipeline() -> None:
    _, panels, crossing = stages()
    fig, axes = figure(width=9.5, height=6.6, ncols=2, nrows=2, sharey=True)
    ranks = torch.arange(1, 33)
    for n, (ax, (title, probs, keep)) in enumerate(zip(axes.flat, panels, strict=True)):
        colors = [COLORS["compute"] if k else COLORS["muted"] for k in keep.tolist()]
        if n == 0:
            colors = [COLORS["reference"]] * 32
        if n == 3:
            colors[crossing] = COLORS["highlight"]
        ax.bar(ranks, probs, color=colors, edgecolor=COLORS["ink"], linewidth=0.3, width=0.8)
        ax.set_title(title, fontsize=10.5, loc="left")
        ax.set_xlim(0.3, 32.7)
        ax.set_xticks([1, 4, 8, 12, 16, 20, 24, 28, 32])
        drawable = f"{int((probs > 0).sum())} of 32 tokens can be drawn"
        ax.text(0.98, 0.72 if n == 3 else 0.8, drawable, transform=ax.transAxes, ha="right",
                fontsize=9.5)
        if n >= 2:
            ax.set_xlabel("token, ranked by raw logit")
        if n % 2 == 0:
            ax.set_ylabel("probability")

    # Panel 4: the cumulative mass over the top-k survivors, and the token that crosses top_p.
    ax = axes[1, 1]
    after_k = panels[2][1]
    cum = after_k[:K].cumsum(0)
    twin = ax.twinx()
    twin.plot(ranks[:K], cum, marker="o", markersize=3.5, color=COLORS["ink"], linewidth=1.0)
    twin.axhline(P, color=COLORS["waste"], linestyle="--", linewidth=1.0)
    twin.text(K + 0.8, P + 0.015, f"top_p = {P}", color=COLORS["waste"], va="bottom",
              fontsize=9)
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("cumulative mass after top-k", fontsize=9.5)
    twin.grid(False)
    twin.spines["right"].set_visible(True)
    before = float(cum[crossing - 1])
    ax.annotate(f"rank {crossing + 1} crosses:\nmass before it {before:.3f} < {P},\n"
                f"so it is kept", xy=(crossing + 1, float(panels[3][1][crossing])),
                xytext=(13, 0.28), fontsize=9, color=COLORS["ink"],
                arrowprops={"arrowstyle": "-|>", "color": COLORS["highlight"], "linewidth": 1.2})
    fig.suptitle("One row of 32 logits through the sampler (the Day 10 claims' row, "
                 "torch.randn seed 10)", fontsize=12, fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "pipeline")


def wrong_reference() -> torch.Tensor:
    """The first, wrong reference: top-p measured on the softmax *before* top-k renormalised."""
    p = (_logits()[0] / T).softmax(-1)
    top = p.argsort(descending=True).tolist()[:K]
    keep, mass = [], 0.0
    for i in top:
        if mass >= P:
            break
        keep.append(i)
        mass += float(p[i])  # not divided by the top-k mass: the bug
    q = torch.zeros_like(p)
    q[keep] = p[keep]
    return q / q.sum()


def draws() -> None:
    order, _, _ = stages()
    counts = _draws(T, K, P)
    empirical = (counts / DRAWS)[order][:12]
    right, wrong = _expected(T, K, P)[order][:12], wrong_reference()[order][:12]
    tv_right = 0.5 * float((counts / DRAWS - _expected(T, K, P)).abs().sum())
    tv_wrong = 0.5 * float((counts / DRAWS - wrong_reference()).abs().sum())

    fig, ax = figure(width=9, height=4.4)
    x = torch.arange(1, 13).float()
    ax.bar(x - 0.2, right, width=0.38, color=COLORS["reference"],
           label=f"reference, vLLM's order (TV {tv_right:.4f})")
    ax.bar(x + 0.2, wrong, width=0.38, color=COLORS["waste"], alpha=0.85,
           label=f"first reference: top-p before renormalising (TV {tv_wrong:.4f})")
    ax.plot(x, empirical, "o", color=COLORS["compute"], markersize=7, zorder=3,
            label=f"sampler, {DRAWS:,} draws in one batch")
    ax.set_xticks(x.tolist())
    ax.set_xlabel("token, ranked by raw logit (ranks 13-32 are never drawn)")
    ax.set_ylabel("probability of being drawn")
    ax.set_title(f"What the sampler draws vs two references (T = {T}, top_k = {K}, "
                 f"top_p = {P}, CPU)", fontsize=11.5)
    ax.legend(loc="upper right", fontsize=9.5)
    save(fig, __file__, "draws")


if __name__ == "__main__":
    pipeline()
    draws()
