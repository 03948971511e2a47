"""Day 54's figures: what a cast costs, a layer before and after fusing, the small-M layout.

    python chapters/day54_fused_cpu_ops/diagram.py

writes three files into build/figures/day54_fused_cpu_ops/:

- norm-cost.png: one bf16 RMSNorm of 8 decode rows x 576, Day 1's module, op by op as a
  ``TorchDispatchMode`` sees it: the bytes of the new tensors each op makes, float32 or bf16,
  beside the fused op, which writes into a buffer it was handed.
- fused-layer.png: one decoder layer as the plain model runs it (its small ops counted the same
  way, per piece) and as ``snapshot/fused.py`` runs it, the residual stream beside it.
- small-gemm-layout.png: ``snapshot/small_gemm.pack`` applied to a 64 x 4 weight of indices:
  where each weight value lands in the packed stream of one 32-column block.

Nothing is timed, no model is loaded and the C++ ops are not needed.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402

from chapters.day01_llama_forward.snapshot.model import apply_rope  # noqa: E402
from chapters.day54_fused_cpu_ops.claims import Dispatched, plain_norm  # noqa: E402
from chapters.day54_fused_cpu_ops.snapshot.small_gemm import BLOCK_N, pack  # noqa: E402
from diagrams import COLORS, box, figure, save  # noqa: E402

ROWS, E, HEADS, D, INTER = 8, 576, 9, 64, 1536
NAMES = {"to": "cast", "pow": "square", "mean": "mean", "add": "+ eps", "rsqrt": "rsqrt",
         "mul": "multiply"}


def norm_cost(ax) -> None:
    ops = plain_norm(torch.bfloat16)
    labels, sizes, colors = [], [], []
    for i, (name, made, dtypes) in enumerate(ops):
        label = NAMES.get(name, name)
        if name == "to":
            label += " to\nfloat32" if torch.float32 in dtypes else " to\nbf16"
        if name == "mul":
            label += "\nby 1/rms" if torch.float32 in dtypes else "\nby weight"
        labels.append(f"{i + 1}. {label}")
        sizes.append(made / 1024)
        colors.append(COLORS["waste"] if torch.float32 in dtypes else COLORS["compute"])
    labels.append("fused\nrms_norm")
    sizes.append(0.0)
    colors.append(COLORS["highlight"])
    xs = range(len(labels))
    ax.bar(xs, sizes, color=colors, width=0.7)
    for x, kib in zip(xs, sizes, strict=True):
        ax.text(x, kib + 0.3, f"{kib:.2f}" if kib < 1 else f"{kib:.0f}", ha="center",
                fontsize=8.5)
    out = ROWS * E * 2 / 1024
    ax.annotate(f"writes its {out:.0f} KiB result\ninto a buffer it was given",
                xy=(len(labels) - 1, 0.4), xytext=(len(labels) - 2.6, 13), fontsize=9,
                arrowprops=dict(arrowstyle="->", color=COLORS["ink"], linewidth=0.8))
    ax.set_xticks(list(xs), labels, fontsize=8.5)
    ax.set_ylabel("KiB of new tensors")
    total = sum(sizes[:-1])
    ax.set_title(f"One bf16 RMSNorm, 8 rows x {E}: {len(ops)} ops, {total:.1f} KiB made for a "
                 f"{out:.0f} KiB answer", loc="left", fontsize=11.5)
    ax.legend(handles=[Patch(color=COLORS["waste"], label="float32 intermediate"),
                       Patch(color=COLORS["compute"], label="bf16"),
                       Patch(color=COLORS["highlight"], label="one C++ pass")],
              fontsize=9, loc="upper right")


def _count(fn) -> int:
    with torch.inference_mode(), Dispatched() as d:
        fn()
    return len(d.ops)


def piece_counts() -> dict[str, int]:
    """How many aten ops each small piece of a bf16 decode layer dispatches (8 rows, 1 token)."""
    bf = torch.bfloat16
    x = torch.randn(ROWS, 1, E).to(bf)
    q = torch.randn(ROWS, HEADS, 1, D).to(bf)
    cos = torch.randn(ROWS, 1, 1, D).to(bf)
    gate_up = torch.randn(ROWS, 1, 2 * INTER).to(bf)

    def act():
        gate, up = gate_up.split(INTER, dim=-1)
        return torch.nn.functional.silu(gate) * up

    return {"norm": len(plain_norm(bf)), "rope": _count(lambda: apply_rope(q, cos, cos)),
            "add": _count(lambda: x + x), "act": _count(act)}


def layer(ax) -> None:
    n = piece_counts()
    w, h, gap = 1.75, 1.0, 0.18
    plain = [(f"RMSNorm\n{n['norm']} ops", "waste"), ("qkv_proj", "compute"),
             (f"RoPE q, k\n2 x {n['rope']} ops", "waste"),
             ("cache write\nindex_copy_\nk and v", "waste"), ("attention\nread", "reference"),
             ("o_proj", "compute"), (f"+ residual\n{n['add']} op", "waste"),
             (f"RMSNorm\n{n['norm']} ops", "waste"), ("gate_up", "compute"),
             (f"SiLU x up\n{n['act']} ops", "waste"), ("down", "compute"),
             (f"+ residual\n{n['add']} op", "waste")]
    fused = [("fused_add\n_rms_norm", "highlight"), ("qkv_proj", "compute"),
             ("rope_and\n_cache", "highlight"), None, ("attention\nread", "reference"),
             ("o_proj", "compute"), None, ("fused_add\n_rms_norm", "highlight"),
             ("gate_up", "compute"), ("silu_and\n_mul", "highlight"), ("down", "compute"), None]
    y_plain, y_fused = 3.2, 0.9
    for i, item in enumerate(plain):
        box(ax, i * (w + gap), y_plain, w, h, item[0], item[1], fontsize=8)
    xs = []
    for i, item in enumerate(fused):
        if item is None:
            continue
        box(ax, i * (w + gap), y_fused, w, h, item[0], item[1], fontsize=8,
            text_color=COLORS["ink"] if item[1] == "highlight" else "white")
        xs.append(i * (w + gap))
    right = len(plain) * (w + gap)
    ax.plot([-0.3, right], [y_fused - 0.45] * 2, color=COLORS["memory"], linewidth=3)
    ax.text(right - 0.1, y_fused - 0.75, "residual stream, updated in place", ha="right",
            fontsize=9, color=COLORS["memory"])
    for i in (0, 7):  # the stream goes into each fused add-and-norm
        x = i * (w + gap) + w / 2
        ax.add_patch(FancyArrowPatch((x, y_fused - 0.45), (x, y_fused), arrowstyle="->",
                                     mutation_scale=10, color=COLORS["memory"], linewidth=1.4))
    ax.text(-0.3, y_plain + h + 0.35, "Day 53: the plain layer, each small op its own dispatch "
            "and its own new tensor", fontsize=10.5)
    ax.text(-0.3, y_fused + h + 0.35, "Day 54: the same matmuls, the small ops fused; the "
            "adds join the next norm, the cache write joins RoPE", fontsize=10.5)
    ax.set_xlim(-0.5, right + 0.1)
    ax.set_ylim(-0.2, y_plain + h + 0.8)
    ax.axis("off")
    ax.legend(handles=[Patch(color=COLORS["compute"], label="matmul"),
                       Patch(color=COLORS["waste"], label="small PyTorch ops"),
                       Patch(color=COLORS["highlight"], label="one C++ op"),
                       Patch(color=COLORS["reference"], label="read (Days 50, 55)")],
              ncol=4, fontsize=9, loc="lower left", bbox_to_anchor=(0.0, -0.08))


def layout(ax) -> None:
    N, K = 2 * BLOCK_N, 4
    index = torch.arange(N * K, dtype=torch.float32).view(N, K)  # value = n * K + k
    packed = pack(index)  # (N/32, K/2, 32, 2)
    hue = {0: "#1f4e8c", 1: "#8fb3e0", 2: "#25704d", 3: "#93d0b0"}  # by input k: pairs 0-1, 2-3

    def cell(x, y, value, label=None):
        n, k = divmod(int(value), K)
        face = hue[k] if n < BLOCK_N else COLORS["muted"]
        ax.add_patch(Rectangle((x, y), 1, 0.9, facecolor=face, edgecolor="white",
                               linewidth=0.4))
        if label:
            ax.text(x + 0.5, y + 0.45, label, ha="center", va="center", fontsize=5.5,
                    color="white" if k % 2 == 0 else COLORS["ink"], rotation=90)

    top = 6.0  # the weight, inputs as rows, outputs as columns
    for n in range(N):
        for k in range(K):
            cell(n, top - k, index[n, k].item())
    for k in range(K):
        ax.text(-0.6, top - k + 0.45, f"input k={k}", ha="right", va="center", fontsize=8)
    ax.text(0, top + 1.2, f"weight: {N} outputs (columns) x {K} inputs (rows); block 0 is "
            f"outputs 0-{BLOCK_N - 1}, block 1 (grey) the next stream", fontsize=9.5)
    stream = packed[0].reshape(K // 2, 2 * BLOCK_N)  # block 0: K/2 rows of 32 outputs x 2
    for kk in range(K // 2):
        y = 1.0 - kk * 1.1
        for j in range(2 * BLOCK_N):
            n, k = divmod(int(stream[kk, j].item()), K)
            cell(j, y, stream[kk, j].item(), f"{n},{k}" if j < 8 else None)
        ax.text(-0.6, y + 0.45, f"pair {kk}: k={2 * kk},{2 * kk + 1}", ha="right",
                va="center", fontsize=8)
    ax.text(0, 2.3, f"block 0 after pack(): ({K // 2}, {BLOCK_N}, 2) in memory order, each "
            "output's two inputs side by side (labels: output, input)", fontsize=9.5)
    y = -0.6
    for lo in (0, BLOCK_N):
        ax.annotate("", xy=(lo, y), xytext=(lo + BLOCK_N, y),
                    arrowprops=dict(arrowstyle="<->", color=COLORS["ink"], linewidth=0.8))
        ax.text(lo + BLOCK_N / 2, y - 0.55, "one dpbf16: 16 outputs x one input pair",
                ha="center", fontsize=8.5)
    ax.set_xlim(-9, N + 1)
    ax.set_ylim(-1.6, top + 1.8)
    ax.axis("off")
    ax.set_title("The small-M kernel's weight layout", loc="left", fontsize=11.5)


if __name__ == "__main__":
    fig, ax = figure(width=10, height=4.2)
    norm_cost(ax)
    save(fig, __file__, "norm-cost")
    fig, ax = figure(width=13, height=4.0)
    layer(ax)
    save(fig, __file__, "fused-layer")
    fig, ax = figure(width=10, height=5.2)
    layout(ax)
    save(fig, __file__, "small-gemm-layout")
