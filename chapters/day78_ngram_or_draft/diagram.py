"""Day 78's figure: where prompt lookup keeps its proposals, and what a draft may cost.

    python chapters/day78_ngram_or_draft/diagram.py

writes ``build/figures/day78_ngram_or_draft/acceptance.png``. Left: for each position 1 to k,
the share of verify steps that kept the proposal there (``accepted_per_pos / num_drafts``), for
prompt lookup on the training and the held-out passages and for the first-layer draft on the
training passages (where the draft_model proposer is built). Right: the speed-up the formula
predicts against the draft's cost ``c`` for k of 4, at acceptance rates of 90% and 50% and at
the draft's own on the training passages, with the ``c`` that the weights read give the two
first-layer drafts and the ``c`` of 1 of a host-bound step. The counts come from the chapter's
exact runs (``claims.figures``): nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day78_ngram_or_draft import claims  # noqa: E402
from chapters.day78_ngram_or_draft.snapshot.speedup import predicted_speedup  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402


def bars(ax) -> None:
    series = [("lookup, training passages", claims.figures("ngram", "train"), COLORS["compute"]),
              ("lookup, held-out passages", claims.figures("ngram", "val"), COLORS["reference"])]
    if claims.draft_missing() is None:
        series.append(("first-layer draft, training passages", claims.figures("draft", "train"),
                       COLORS["highlight"]))
    width = 0.8 / len(series)
    for i, (name, f, color) in enumerate(series):
        xs = [p + 1 + (i - (len(series) - 1) / 2) * width for p in range(claims.K)]
        ax.bar(xs, [100 * s for s in f["pos_share"]], width, color=color,
               label=f"{name} ({f['drafts']} verify steps)")
    ax.set_xticks(range(1, claims.K + 1))
    ax.set_xlabel("position of the proposal")
    ax.set_ylabel("verify steps that kept it (%)")
    ax.set_ylim(0, 115)
    ax.set_title("Where proposals are kept", fontsize=11, loc="left")
    ax.legend(fontsize=8, loc="upper right")


def curves(ax) -> None:
    k = claims.K
    rates = [("", 0.9, COLORS["compute"]), ("", 0.5, COLORS["ink"])]
    if claims.draft_missing() is None:
        rates.append(("the draft's", claims.figures("draft", "train")["rate"],
                      COLORS["highlight"]))
    cs = [1.2 * i / 120 for i in range(121)]
    for who, a, color in rates:
        ax.plot(cs, [predicted_speedup(a, k, c) for c in cs], color=color, lw=1.6,
                label=f"a = {a:.0%}" + (f" ({who} on training passages)" if who else ""))
    ax.axhline(1, color=COLORS["waste"], lw=1, ls="--")
    marks = [(claims.c_from_weights("smollm2"), "SmolLM2-135M's first layer\n(weights read)"),
             (claims.c_from_weights("shipped"), "the shipped model's first layer\n(weights "
                                                 "read)"),
             (1.0, "host-bound")]
    top = ax.get_ylim()[1]
    for (c, text), y in zip(marks, (0.97, 0.84, 0.97), strict=True):
        ax.axvline(c, color=COLORS["reference"], lw=0.8, ls=":")
        ax.annotate(text, (c, top * y), fontsize=7, ha="left", xytext=(3, 0),
                    textcoords="offset points", va="top")
    ax.set_xlabel("c: a draft step's cost in target steps")
    ax.set_ylabel("predicted speed-up")
    ax.set_title(f"What a proposal may cost (k = {k})", fontsize=11, loc="left")
    ax.legend(fontsize=8, loc="center right")


if __name__ == "__main__":
    fig, (left, right) = figure(width=11, height=4.5, ncols=2)
    bars(left)
    curves(right)
    save(fig, __file__, "acceptance")
