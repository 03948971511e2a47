"""The shipped model's perplexity in every scheme ``nanoserve quantize`` writes, on its training
text and on the held-out split, with GPTQ's per-layer error beside RTN's.

Why this script exists: issue 40 asks for quality measured, never assumed. This runs the same
code as the command (``Recipe``, ``calibration_windows`` on the training text as a file's text
would be tokenized, ``quantize_model``) and measures each result as its reference model
(``quality.reference_model``: dequantized weights, the dense tensors rounded to bfloat16 as the
checkpoint stores them, W8A8's inputs fake-quantized per token), computing in float32, over the
same windows ``tools/train_tiny.py`` reports its validation loss on.

    python tools/quantize_quality.py [--num-samples 128] [--seq-len 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from tokenizers import Tokenizer as HFTokenizer

from nanoserve.model.text_loss import corpus, encode_stream
from nanoserve.model.weights import load_model
from nanoserve.quantize.calibrate import calibration_windows, quantize_model
from nanoserve.quantize.quality import layer_errors, perplexity, reference_model
from nanoserve.quantize.recipe import Recipe
from nanoserve.tokenizer import Tokenizer

SHIPPED = "nanoserve/checkpoints/nanoserve-tiny"
VARIANTS = [  # label, recipe (None: dense)
    ("w8a16 rtn g128", Recipe("w8a16", "rtn", 128)),
    ("w8a16 gptq g128", Recipe("w8a16", "gptq", 128)),
    ("w4a16 rtn g128", Recipe("w4a16", "rtn", 128)),
    ("w4a16 gptq g128", Recipe("w4a16", "gptq", 128)),
    ("w4a16 rtn g32", Recipe("w4a16", "rtn", 32)),
    ("w4a16 gptq g32", Recipe("w4a16", "gptq", 32)),
    ("w4a16 rtn channel", Recipe("w4a16", "rtn", None)),
    ("w4a16 gptq channel", Recipe("w4a16", "gptq", None)),
    ("w8a8 rtn (fake quant)", Recipe.of("w8a8", method="rtn")),
    ("w8a8 gptq (fake quant)", Recipe.of("w8a8", method="gptq")),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-samples", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    train_docs, val_docs = corpus()
    hf_tok = HFTokenizer.from_file(f"{SHIPPED}/tokenizer.json")
    streams = {"train": encode_stream(hf_tok, train_docs), "held-out": encode_stream(hf_tok,
                                                                                      val_docs)}
    windows = calibration_windows(Tokenizer.from_dir(SHIPPED), "".join(train_docs),
                                  args.num_samples, args.seq_len)
    dense = load_model(SHIPPED, dtype="float32")
    rows = []

    def measure(label, model, extra=None):
        ppl = {k: perplexity(model, s, args.seq_len) for k, s in streams.items()}
        rows.append({"variant": label, **ppl, **(extra or {})})
        print(f"{label:24s} train {ppl['train']:8.3f}  held-out {ppl['held-out']:8.3f}"
              + (f"  {extra}" if extra else ""), flush=True)

    measure("float32", dense)
    measure("bfloat16", load_model(SHIPPED, dtype="bfloat16"))
    for label, recipe in VARIANTS:
        model = load_model(SHIPPED, dtype="float32")
        quantized = quantize_model(model, recipe, windows if recipe.needs_calibration else None)
        extra = {"quantized_linears": len(quantized)}
        if recipe.method == "gptq":
            errs = layer_errors(dense, recipe, windows)
            ratios = [e["gptq"] / e["rtn"] for e in errs.values()]
            extra.update(gptq_below_rtn=sum(r < 1 for r in ratios), layers=len(ratios),
                         worst_ratio=round(max(ratios), 4), best_ratio=round(min(ratios), 4))
        measure(label, reference_model(dense, quantized, dense_dtype=torch.bfloat16), extra)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"num_samples": args.num_samples, "seq_len": args.seq_len,
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
