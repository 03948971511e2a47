"""Day 71's figure: how far each family sits from transformers, and how far each negative
control moves it.

    python chapters/day71_family_parity/diagram.py

writes build/figures/day71_family_parity/parity-and-controls.png from the claims' own
measurements (``claims.py``), on one log axis of |logit difference| in float32:

- top: each family's largest difference against transformers over every path, and
  transformers against itself on Gemma 3's test model (norms drawn around 0, and around 1);
- bottom: the change each negative control makes, and the one control that cannot fail
  (Llama's norms reset to the ones they already are: exactly 0, drawn at the axis' floor);
- the bound (1e-5) and the floor a control must clear (1e-3) as vertical lines.

It writes the small checkpoints and runs the comparisons (no ``-tp 2``, which spawns a
process); nothing is timed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chapters.day71_family_parity import claims  # noqa: E402
from chapters.day71_family_parity.snapshot.parity import BOUND, CONTROL  # noqa: E402
from diagrams import COLORS, figure, save  # noqa: E402

FLOOR = 1e-8  # where an exact 0 is drawn


def rows() -> list[tuple[str, float, str]]:
    """(label, value, colour key), top to bottom."""
    out = [(f"{n} vs transformers", claims.worst(n), "compute") for n in claims.FAMILIES]
    gemma = claims.checkpoint("Gemma 3")
    out += [("transformers vs itself, Gemma 3", claims.transformers_self_spread(gemma),
             "reference"),
            ("transformers vs itself, Gemma 3\nnorms drawn around 1",
             claims.transformers_self_spread(claims.gemma_norms_around_one()), "reference")]
    controls = [
        ("Mistral: window ignored", claims.mistral_window),
        ("Gemma 3: window ignored", claims.gemma_window),
        ("Gemma 3: local layers on global base", claims.gemma_local_base),
        ("Phi-3: partial rotary made whole", claims.phi3_whole_rotary),
        ("Phi-3: long factors = short", claims.phi3_short_for_long),
        ("Qwen2: biases zeroed", lambda: claims.weight_control("Qwen2", ("bias",), 0.0)),
        ("Qwen3: q/k norms reset to 1", lambda: claims.weight_control(
            "Qwen3", ("q_norm.weight", "k_norm.weight"), 1.0)),
        ("Gemma 3: norms reset to 0", lambda: claims.weight_control("Gemma 3", claims.NORMS,
                                                                     0.0)),
        ("Qwen2: norms reset to 1", lambda: claims.weight_control("Qwen2", claims.NORMS, 1.0)),
    ]
    out += [(f"control, {label}", fn(), "waste") for label, fn in controls]
    out.append(("control, Llama: norms reset to 1\n(cannot fail)",
                claims.weight_control("Llama", claims.NORMS, 1.0), "highlight"))
    return out


if __name__ == "__main__":
    data = rows()
    fig, ax = figure(width=9, height=7.5)
    ys = range(len(data))[::-1]
    for y, (_, v, color) in zip(ys, data, strict=True):
        ax.barh(y, max(v, FLOOR), left=FLOOR, color=COLORS[color])
        ax.text(max(v, FLOOR) * 1.3, y, "0 (exactly)" if v == 0 else f"{v:.1e}",
                va="center", fontsize=8.5)
    ax.set_yticks(list(ys), [label for label, _, _ in data], fontsize=8.5)
    ax.set_xscale("log")
    ax.set_xlim(FLOOR, 100)
    ax.axvline(BOUND, color=COLORS["ink"], linestyle="--", linewidth=1)
    ax.axvline(CONTROL, color=COLORS["ink"], linestyle=":", linewidth=1)
    top = len(data) - 0.4
    ax.text(BOUND * 1.2, top, "bound 1e-5", fontsize=8.5)
    ax.text(CONTROL * 1.2, top, "control floor 1e-3", fontsize=8.5)
    ax.set_xlabel("largest |logit difference|, float32 (log scale)")
    ax.set_title("Parity with transformers, and what each negative control moves", loc="left")
    fig.tight_layout()
    save(fig, __file__, "parity-and-controls")
