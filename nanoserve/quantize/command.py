"""``nanoserve quantize MODEL OUT``: the command's flags, their refusals, and the run.

Why this module exists: the CLI should make a quantized checkpoint in one line, and refuse a
meaningless request (an unknown scheme, GPTQ without calibration text, a group of no inputs)
before it loads a model. The work is the package's: ``Recipe`` checks the flags,
``quantize_model`` quantizes, ``write_checkpoint`` writes.

    nanoserve quantize nanoserve/checkpoints/nanoserve-tiny /tmp/tiny-w4 --scheme w4a16 \\
        --group-size 32 --method gptq --calibration train.txt --num-samples 64 --seq-len 256
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from nanoserve.quantization.compressed_tensors_write import SCHEMES
from nanoserve.quantize.recipe import METHODS, Recipe

log = logging.getLogger("nanoserve")
DENSE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def group_size(text: str) -> int | None | str:
    """``--group-size``: a positive integer, or ``channel`` (one scale per output feature);
    ``default`` (its default) leaves it to the scheme."""
    if text in ("channel", "default"):
        return None if text == "channel" else text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor 'channel'") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a Hugging Face checkpoint folder")
    p.add_argument("out", help="the folder to write the compressed-tensors checkpoint to")
    p.add_argument("--scheme", required=True, help=f"one of {', '.join(SCHEMES)}")
    p.add_argument("--group-size", type=group_size, default="default",
                   help="inputs per scale, or 'channel' (default: 128; w8a8: channel)")
    p.add_argument("--method", default="rtn", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--calibration", default=None,
                   help="a text file of calibration text (required by gptq)")
    p.add_argument("--asymmetric", action="store_true", help="zero points (weight-only schemes)")
    p.add_argument("--num-samples", type=int, default=128, help="calibration windows")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per calibration window")
    p.add_argument("--damp", type=float, default=0.01, help="GPTQ's damping (of mean diag H)")
    p.add_argument("--dtype", default="bfloat16", help="the dense tensors' and scales' dtype: "
                   "bfloat16 or float32")


def recipe_of(args: argparse.Namespace) -> Recipe:
    """The recipe the flags ask for, or a ``ValueError`` saying which flag is wrong."""
    if args.dtype not in DENSE_DTYPES:
        raise ValueError(f"--dtype {args.dtype!r}; choose one of {tuple(DENSE_DTYPES)}")
    recipe = Recipe.of(args.scheme, args.group_size, method=args.method,
                       symmetric=not args.asymmetric, damp=args.damp,
                       scale_dtype=DENSE_DTYPES[args.dtype])
    if recipe.needs_calibration and not args.calibration:
        raise ValueError(f"--method {recipe.method} needs --calibration FILE (a text file)")
    if args.calibration and not Path(args.calibration).is_file():
        raise ValueError(f"--calibration {args.calibration}: no such file")
    return recipe


def run(args: argparse.Namespace) -> Path:
    """Quantize ``args.model`` into ``args.out``; returns the folder."""
    from nanoserve.model.weights import load_model
    from nanoserve.quantize.calibrate import calibration_windows, quantizable, quantize_model
    from nanoserve.quantize.write import write_checkpoint
    from nanoserve.tokenizer import Tokenizer

    recipe = recipe_of(args)
    model = load_model(args.model, dtype="float32")
    _, skipped = quantizable(model, recipe)
    if skipped:
        log.warning("group size %s does not divide the inputs of %d linears (%s, ...); they "
                    "stay dense and are listed in ignore", recipe.group_size, len(skipped),
                    skipped[0])
    windows = None
    if recipe.needs_calibration:
        text = Path(args.calibration).read_text()
        windows = calibration_windows(Tokenizer.from_dir(args.model), text, args.num_samples,
                                      args.seq_len)
    quantized = quantize_model(model, recipe, windows)
    return write_checkpoint(args.model, args.out, model, quantized, recipe, skipped,
                            DENSE_DTYPES[args.dtype])


def quantize_checkpoint(model: str | Path, out: str | Path, scheme: str,
                        group_size: int | None | str = "default", method: str = "rtn",
                        symmetric: bool = True, calibration: str | None = None,
                        num_samples: int = 128, seq_len: int = 512, damp: float = 0.01,
                        dtype: str = "bfloat16") -> Path:
    """What ``nanoserve quantize`` does, called from Python (the benches, the tests, a
    chapter): the same flags as keywords, the same checks, the same folder."""
    args = argparse.Namespace(model=str(model), out=str(out), scheme=scheme,
                              group_size=group_size, method=method, calibration=calibration,
                              asymmetric=not symmetric, num_samples=num_samples,
                              seq_len=seq_len, damp=damp, dtype=dtype)
    return run(args)


def main(args: argparse.Namespace) -> int:
    try:
        out = run(args)
    except ValueError as e:
        print(f"nanoserve: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0
