"""Day 79's figure: how much choice a forced call leaves the model, token by token.

    python chapters/day79_tool_call_grammar/diagram.py

writes build/figures/day79_tool_call_grammar/forced-steps.png: one call to ``get_weather``
written token by token on the shipped tokenizer, first as a ``"required"`` output with one
call allowed, then as the arguments of a named choice. At each step the bar is the number of
tokens the package's mask allows (log scale): the structure the schema fixes (brackets, keys,
the closing brace) leaves one token, the name leaves the starts of the tool names, and the free
text of a string leaves most of the vocabulary. Nothing is generated; the matcher is walked
over fixed text, so the figure takes seconds.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day79_tool_call_grammar import claims  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

CALLS = {"tool_choice \"required\", one call":
         ("required", '[{"name":"get_weather","parameters":{"city":"Paris","unit":"C"}}]'),
         "tool_choice naming get_weather":
         (claims.named("get_weather"), '{"city":"Paris","unit":"C"}')}


def steps(choice, text: str) -> tuple[list[str], list[int]]:
    """The text's tokens, and how many tokens the mask allowed before each."""
    from nanoserve.structured.mask import allowed, fill

    tok = claims.tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    m = claims.backend().matcher(claims.spec(choice, parallel=False))
    counts = []
    for i in ids:
        counts.append(int(allowed(fill([m], claims.VOCAB), claims.VOCAB)[0].sum()))
        assert m.consume_tokens([i])
    return [tok.decode([i]) for i in ids], counts


def main() -> None:
    fig, axes = figure(width=12, height=6.4, nrows=2)
    for ax, (title, (choice, text)) in zip(axes, CALLS.items(), strict=True):
        labels, counts = steps(choice, text)
        colors = [COLORS["reference"] if c == 1 else COLORS["highlight"] for c in counts]
        ax.bar(range(len(counts)), counts, color=colors)
        ax.set_yscale("log")
        ax.set_ylim(0.8, claims.VOCAB * 1.5)
        ax.axhline(claims.VOCAB, color=COLORS["ink"], linewidth=0.8, linestyle="--")
        ax.text(len(counts) - 0.5, claims.VOCAB * 0.6, "the whole vocabulary", ha="right",
                fontsize=8)
        ax.set_xticks(range(len(labels)), [repr(t)[1:-1] for t in labels], rotation=60,
                      fontsize=8, fontfamily="monospace")
        ax.set_ylabel("tokens allowed")
        ax.set_title(title, fontsize=11)
    fig.suptitle("A forced call: grey steps have one legal token, orange ones leave a choice",
                 fontsize=12, fontweight="bold")
    fig.tight_layout()
    save(fig, __file__, "forced-steps")


if __name__ == "__main__":
    main()
