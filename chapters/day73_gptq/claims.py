"""Day 73's numbers: GPTQ against round-to-nearest on the shipped model, nanoserve-tiny.

Three kinds of measurement, none of which reads a clock:

- the worked example, on the frozen snapshot (two correlated inputs, an integer grid);
- the solver on one real layer, layer 0's ``qkv_proj``: its inputs are captured with a forward
  hook while the float32 model reads calibration windows of the training text and, separately,
  windows of other training text; the Hessian's rank, the Cholesky identity, lazy batches against
  column-at-a-time updates, and what the number of calibration tokens and the damping do to the
  output error on the other text;
- a reduced rerun of the quality table: ``nanoserve quantize``'s own code (``Recipe``,
  ``calibration_windows``, ``quantize_model``, ``write_checkpoint``) writes each variant's
  compressed-tensors folder, nanoserve's loader reads it back (``load_model(folder, "float32")``),
  and ``quality.perplexity`` scores it on the first windows of two texts. GPTQ calibrates on the
  first half of the training topics, and the "training windows" are the first windows of the
  other half, so no evaluated token was a calibration token. The per-layer errors come from the
  same GPTQ pass (an observer, as ``quality.layer_errors`` does it).

The full table (128 calibration windows, every window of both texts) is ``recorded``: it took a
quarter of an hour, and ``results/quality.json`` names the machine, date and command. Its
``rows`` are what ``tools/quantize_quality.py --json`` wrote; its ``values`` are read from them.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

from chapters.common import SHIPPED
from chapters.runner import bound, exact, recorded

from .snapshot.obq import gptq_columns, output_error

SEQ = 256  # tokens per window, calibration and perplexity alike
CALIB_WINDOWS = 16  # the rerun's calibration: 4,096 tokens
EVAL_WINDOWS = 16  # the rerun's perplexity: the first 16 windows of each text
VARIANTS = {  # label -> (scheme, method, group size); float32 and bf16 are the dense models
    "w8a16 RTN group 128": ("w8a16", "rtn", 128),
    "w4a16 RTN group 128": ("w4a16", "rtn", 128),
    "w4a16 GPTQ group 128": ("w4a16", "gptq", 128),
    "w4a16 RTN group 32": ("w4a16", "rtn", 32),
    "w4a16 GPTQ group 32": ("w4a16", "gptq", 32),
    "w8a8 RTN": ("w8a8", "rtn", None),
}
RESULTS = "quality.json"


# ------------------------------------------------------------------------------ worked example

@functools.cache
def worked() -> dict:
    """Two inputs of correlation 0.9, a row of weights 0.4 and 0.4, an integer grid."""
    H = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=torch.float64)
    w = torch.tensor([[0.4, 0.4]], dtype=torch.float64)
    q, seen = gptq_columns(w, H, step=1.0)
    every = [output_error(w - torch.tensor([[a, b]], dtype=torch.float64), H)
             for a in (0.0, 1.0) for b in (0.0, 1.0)]
    mine = output_error(w - q, H)
    return {"moved": seen[0, 1].item(), "rtn": output_error(w - torch.round(w), H),
            "gptq": mine, "better": sum(e < mine - 1e-12 for e in every)}


# ------------------------------------------------------------------------------ texts

@functools.cache
def texts() -> dict:
    """The training topics split in two halves, and the held-out topics
    (``nanoserve.model.text_loss.corpus``: every 10th topic by name held out)."""
    from nanoserve.model.text_loss import corpus

    train, held = corpus()
    half = len(train) // 2
    return {"calibration": train[:half], "training": train[half:], "held-out": held}


@functools.cache
def streams() -> dict[str, torch.Tensor]:
    """The first EVAL_WINDOWS windows (and the next token) of the unseen training half and of
    the held-out split, encoded as training encoded them (BOS doc EOS ...)."""
    from tokenizers import Tokenizer as HFTokenizer

    from nanoserve.model.text_loss import encode_stream

    tok = HFTokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    return {k: encode_stream(tok, texts()[k])[:EVAL_WINDOWS * SEQ + 1]
            for k in ("training", "held-out")}


@functools.cache
def windows(which: str = "calibration", n: int = CALIB_WINDOWS) -> torch.Tensor:
    """``n`` windows of SEQ tokens (n, SEQ) spread over one text, as ``nanoserve quantize
    --calibration`` cuts a file."""
    from nanoserve.quantize.calibrate import calibration_windows
    from nanoserve.tokenizer import Tokenizer

    return calibration_windows(Tokenizer.from_dir(SHIPPED), "".join(texts()[which]), n, SEQ)


@functools.cache
def dense(dtype: str = "float32"):
    from nanoserve.model.weights import load_model

    torch.manual_seed(0)
    return load_model(SHIPPED, dtype=dtype)


# ------------------------------------------------------------------------------ one layer

@functools.cache
def layer0_inputs() -> dict[str, torch.Tensor]:
    """The (n, 256) inputs of layer 0's qkv_proj, float64: from the calibration windows, and
    from as many windows of the other training half."""
    lin = dense().layers[0].self_attn.qkv_proj
    seen = []
    hook = lin.register_forward_hook(
        lambda m, a, o: seen.append(a[0].reshape(-1, a[0].shape[-1]).double()))
    try:
        with torch.no_grad():
            for ids in (windows(), windows("training")):
                dense()(ids, torch.arange(SEQ)[None].expand_as(ids))
    finally:
        hook.remove()
    return {"calibration": seen[0], "other": seen[1]}


def hessian(x: torch.Tensor) -> torch.Tensor:
    return 2 * x.T @ x / len(x)  # (K, K), as calibrate.py accumulates it


def layer0_weight() -> torch.Tensor:
    return dense().layers[0].self_attn.qkv_proj.weight.detach()  # (512, 256)


def ranks() -> str:
    x = layer0_inputs()["calibration"]
    return ", ".join(f"{torch.linalg.matrix_rank(hessian(x[:n])).item()}"
                     for n in (64, 256, len(x)))


def cholesky_identity() -> float:
    """Row j of GPTQ's upper Cholesky factor of H^-1 against the inverse after columns < j are
    eliminated one by one (divided by the square root of its diagonal): the largest difference,
    relative to the row's largest entry."""
    from nanoserve.quantization.gptq import inverse_cholesky

    H = hessian(layer0_inputs()["calibration"])
    K = H.shape[0]
    U = inverse_cholesky(H, 0.01)
    Hinv = torch.linalg.inv(H + 0.01 * torch.diag(H).mean() * torch.eye(K, dtype=H.dtype))
    worst = 0.0
    for j in range(K):
        row = Hinv[j, j:] / Hinv[j, j].sqrt()
        worst = max(worst, ((row - U[j, j:]).abs().max() / U[j, j:].abs().max()).item())
        Hinv = Hinv - Hinv[:, j:j + 1] @ Hinv[j:j + 1, :] / Hinv[j, j]
    return worst


def lazy_batches() -> str:
    from nanoserve.quantization.gptq import gptq

    w, H = layer0_weight(), hessian(layer0_inputs()["calibration"])
    a = gptq(w, H, 4, 32, True, block_size=1).q
    b = gptq(w, H, 4, 32, True, block_size=128).q
    return f"{(a != b).sum().item()} of {a.numel():,}"


def undamped() -> str:
    """GPTQ with no damping on 64 calibration tokens: the Hessian is singular."""
    from nanoserve.quantization.gptq import gptq

    try:
        gptq(layer0_weight(), hessian(layer0_inputs()["calibration"][:64]), 4, 32, True, damp=0)
    except (ValueError, RuntimeError):
        return "fails: not positive definite"
    return "succeeds"


@functools.cache
def other_text_ratio(tokens: int, damp: float) -> float:
    """Layer 0 qkv_proj's output error on the other training half's inputs, GPTQ (calibrated on
    the first ``tokens`` calibration tokens, damped by ``damp``) over RTN, w4a16 group 32."""
    from nanoserve.quantization.gptq import gptq
    from nanoserve.quantization.rtn import quantize_rtn
    from nanoserve.quantize.quality import relative_error

    w, x = layer0_weight(), layer0_inputs()
    other = hessian(x["other"])
    g = gptq(w, hessian(x["calibration"][:tokens]), 4, 32, True, damp=damp).dequantize()
    return relative_error(w, g, other) / relative_error(w, quantize_rtn(w, 4, 32).dequantize(),
                                                        other)


def ratio_row(tokens: int) -> str:
    return ", ".join(f"{other_text_ratio(tokens, d):.2f}x" for d in (0.01, 1.0))


# ------------------------------------------------------------------------------ the model

@functools.cache
def _out() -> Path:
    return Path(tempfile.mkdtemp(prefix="nanoserve-day73-"))


@functools.cache
def folder(label: str) -> tuple[Path, dict, dict]:
    """Quantize a fresh float32 copy of the shipped model as ``label`` and write its
    compressed-tensors folder: (the folder, the QuantizedWeights by nanoserve name, per-layer
    relative output errors {name: {"rtn": e, "gptq": e}} for a GPTQ variant)."""
    from nanoserve.model.weights import load_model
    from nanoserve.quantize.calibrate import quantizable, quantize_model
    from nanoserve.quantize.quality import relative_error
    from nanoserve.quantize.recipe import Recipe
    from nanoserve.quantize.write import write_checkpoint

    scheme, method, group = VARIANTS[label]
    recipe = Recipe(scheme, method, group)
    rtn, errors = recipe.with_method("rtn"), {}

    def observe(name, w, H, qw):
        errors[name] = {"rtn": relative_error(w, rtn.quantize(w).dequantize(), H),
                        "gptq": relative_error(w, qw.dequantize(), H)}

    model = load_model(SHIPPED, dtype="float32")
    _, skipped = quantizable(model, recipe)
    calibration = windows() if recipe.needs_calibration else None
    quantized = quantize_model(model, recipe, calibration, observe=observe if calibration
                               is not None else None)
    out = write_checkpoint(SHIPPED, _out() / label.replace(" ", "-"), model, quantized, recipe,
                           skipped)
    return out, quantized, errors


@functools.cache
def perplexities(label: str) -> dict[str, float]:
    """``label``'s perplexity on the first EVAL_WINDOWS windows of each text: the dense model
    in float32 or bf16, or the folder as nanoserve's loader reads it (computing in float32)."""
    from nanoserve.model.weights import load_model
    from nanoserve.quantize.quality import perplexity

    if label in ("float32", "bf16"):
        model = dense("bfloat16" if label == "bf16" else "float32")
    else:
        model = load_model(folder(label)[0], dtype="float32")
    return {k: perplexity(model, s, SEQ) for k, s in streams().items()}


def ratio(label: str, text: str = "training") -> float:
    return perplexities(label)[text] / perplexities("float32")[text]


def held_out_change(label: str) -> float:
    return abs(ratio(label, "held-out") - 1)


def largest_held_out_change() -> float:
    return max(held_out_change(v) for v in ("bf16", *VARIANTS))


def excess_ratio(group: int) -> float:
    """Perplexity GPTQ adds over float32 on the training windows, over what RTN adds."""
    f32 = perplexities("float32")["training"]
    return ((perplexities(f"w4a16 GPTQ group {group}")["training"] - f32)
            / (perplexities(f"w4a16 RTN group {group}")["training"] - f32))


def below(group: int) -> str:
    errors = folder(f"w4a16 GPTQ group {group}")[2]
    return f"{sum(e['gptq'] < e['rtn'] for e in errors.values())} of {len(errors)}"


def worst_layer_ratio() -> float:
    return max(e["gptq"] / e["rtn"] for g in (128, 32)
               for e in folder(f"w4a16 GPTQ group {g}")[2].values())


@functools.cache
def loaded_and_memory() -> dict:
    """The loaded w4a16 GPTQ group 32 folder against the model in memory with its dequantized
    weights (``quality.reference_model``: dense tensors rounded to bf16 as the folder stores
    them), both computing in float32. ``reference_model`` rounds every tensor of the copy, the
    rotary frequencies (a buffer, never stored in the folder) included: with them put back, the
    largest logit difference on one training window; as it is, the perplexity change."""
    from nanoserve.model.weights import load_model
    from nanoserve.quantize.quality import perplexity, reference_model

    path, quantized, _ = folder("w4a16 GPTQ group 32")
    loaded = load_model(path, dtype="float32")
    rounded = reference_model(dense(), quantized, dense_dtype=torch.bfloat16)
    restored = reference_model(dense(), quantized, dense_dtype=torch.bfloat16)
    buffers = dict(dense().named_buffers())
    for name, b in restored.named_buffers():
        b.copy_(buffers[name])
    ids, pos = streams()["training"][:SEQ][None], torch.arange(SEQ)[None]
    with torch.no_grad():
        a, b = (m.compute_logits(m(ids, pos)) for m in (loaded, restored))
    change = max(abs(perplexity(rounded, s, SEQ) / perplexities("w4a16 GPTQ group 32")[k] - 1)
                 for k, s in streams().items())
    return {"logits": (a - b).abs().max().item(), "rope": change}


def ignored() -> str:
    import json

    cfg = json.loads((folder("w4a16 RTN group 32")[0] / "config.json").read_text())
    rest = [n for n in cfg["quantization_config"]["ignore"] if n != "lm_head"]
    return f"{len(rest)} of {4 * 7}, all {', '.join(sorted({n.rsplit('.', 1)[1] for n in rest}))}"


def dense_share() -> float:
    """The share of the decoder linears' stored bytes (packed integers, scales, shapes, and the
    dense down_proj in bf16) that the four dense down_proj take, w4a16 group 32."""
    from safetensors.torch import load_file

    sd = load_file(folder("w4a16 RTN group 32")[0] / "model.safetensors")
    parts = ("_proj.weight", "_proj.weight_packed", "_proj.weight_scale", "_proj.weight_shape")
    linear = {k: v.numel() * v.element_size() for k, v in sd.items() if k.endswith(parts)}
    down = sum(b for k, b in linear.items() if k.endswith("down_proj.weight"))
    return down / sum(linear.values())


# ------------------------------------------------------------------------------ claims

def _ppl(label: str) -> str:
    p = perplexities(label)
    return f"{p['training']:.3f}, {p['held-out']:.1f}"


def _fmt_ppl(v: list) -> str:
    return f"{v[0]:.3f}, {v[1]:.1f}"


RERUN = "first 16 windows"
FULL = "(recorded, 128 calibration windows, every window)"
RECORDED = ["float32", "bf16", "w8a16 RTN group 128", "w8a16 GPTQ group 128",
            "w4a16 RTN group 128", "w4a16 GPTQ group 128", "w4a16 RTN group 32",
            "w4a16 GPTQ group 32", "w4a16 RTN per channel", "w4a16 GPTQ per channel",
            "w8a8 RTN", "w8a8 GPTQ"]

CLAIMS = [
    exact("worked example (correlation 0.9, weights 0.4 and 0.4, integer grid): the second "
          "weight after the first's error is fed back", lambda: f"{worked()['moved']:.2f}"),
    exact("worked example: squared output error, round-to-nearest",
          lambda: f"{worked()['rtn']:.3f}"),
    exact("worked example: squared output error, GPTQ", lambda: f"{worked()['gptq']:.3f}"),
    exact("worked example: roundings of the two weights with a lower output error than GPTQ's",
          lambda: f"{worked()['better']} of 4"),
    exact("rank of layer 0's qkv_proj Hessian (256 inputs) from 64, 256 and 4,096 calibration "
          "tokens", ranks),
    bound("layer 0's qkv_proj: rows of the upper Cholesky factor of H⁻¹ against the inverse "
          "updated column by column, largest relative difference", cholesky_identity,
          fmt="{:.1e}".format),
    exact("layer 0's qkv_proj, w4a16 group 32: integers that differ between lazy batches of "
          "128 columns and one column at a time", lazy_batches),
    exact("layer 0's qkv_proj, GPTQ with no damping on 64 calibration tokens", undamped),
    exact("layer 0's qkv_proj output error on other training text, GPTQ / RTN, w4a16 group 32, "
          "64 calibration tokens, damp 0.01 and 1", lambda: ratio_row(64)),
    exact("layer 0's qkv_proj output error on other training text, GPTQ / RTN, w4a16 group 32, "
          "4,096 calibration tokens, damp 0.01 and 1", lambda: ratio_row(4096)),
    exact(f"perplexity, training and held-out windows ({RERUN}), float32", lambda: _ppl("float32")),
    *[bound(f"training-window perplexity / float32's ({RERUN}), {v}", functools.partial(ratio, v),
            fmt="{:.4f}".format) for v in ("bf16", *VARIANTS)],
    bound(f"held-out perplexity's change from float32's, either way ({RERUN}), any variant",
          largest_held_out_change, fmt="{:.2%}".format),
    exact(f"perplexity added over float32's on the training windows, GPTQ / RTN ({RERUN}), "
          "w4a16 group 128", lambda: f"{excess_ratio(128):.2f}"),
    exact(f"perplexity added over float32's on the training windows, GPTQ / RTN ({RERUN}), "
          "w4a16 group 32", lambda: f"{excess_ratio(32):.2f}"),
    exact("linears whose output error GPTQ leaves below RTN's, w4a16 group 128",
          lambda: below(128)),
    exact("linears whose output error GPTQ leaves below RTN's, w4a16 group 32", lambda: below(32)),
    bound("largest layer's output error, GPTQ / RTN, w4a16 groups 128 and 32", worst_layer_ratio,
          fmt="{:.3f}".format),
    bound("largest logit difference, the loaded w4a16 GPTQ group 32 folder against its "
          "dequantized weights in memory", lambda: loaded_and_memory()["logits"],
          fmt="{:.1e}".format),
    bound(f"perplexity change, either text ({RERUN}), from reference_model's rotary frequencies "
          "rounded to bf16, w4a16 GPTQ group 32", lambda: loaded_and_memory()["rope"],
          fmt="{:.4%}".format),
    exact("Hugging Face linears left dense at groups 32 and 128 (in ignore besides lm_head)",
          ignored),
    exact("share of the decoder linears' stored bytes held by the dense down_proj, w4a16 "
          "group 32", lambda: f"{dense_share():.0%}"),
    *[recorded(f"perplexity, training text and held-out split {FULL}, {v}", RESULTS, v,
               fmt=_fmt_ppl) for v in RECORDED],
    recorded(f"linears whose output error GPTQ leaves below RTN's, all five GPTQ runs {FULL}",
             RESULTS, "gptq below rtn"),
    recorded(f"largest layer's output error, GPTQ / RTN, any GPTQ run {FULL}", RESULTS,
             "worst layer ratio", fmt="{:.2f}".format),
    recorded(f"held-out perplexity's change from float32's, either way, any variant {FULL}",
             RESULTS, "largest held-out change", fmt="{:.2%}".format),
]
