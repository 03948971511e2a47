"""Day 75's claims: what four-bit and eight-bit weights buy a decode step, against the byte
ceiling, against bf16 and against llama.cpp on the same weights.

Two sources:

- **Rerun here** (exact and timed): a random Llama of eight SmolLM2-135M layers (hidden 576,
  intermediate 1,536, 9 query and 3 KV heads of 64) with a vocabulary of 8,192 tied to the
  head, written by transformers in bf16 and quantized by ``nanoserve quantize`` (w4a16, group
  32, symmetric, round-to-nearest, head left bf16). Its bytes per decode step come from
  ``nanoserve.bench.quant_arms.step_bytes`` (``QuantizedWeight.nbytes`` and the head); its
  Q4_0 GGUF from ``nanoserve.bench.gguf_export``, read back by the gguf package. The one timed
  claim decodes one request (16 random prompt ids, 64 greedy tokens, EOS ignored) on one thread
  pinned to one CPU, bf16 and w4a16 in interleaved rounds (best of five each), and states the
  ratio with about half the measured gain as its bound, so that a busy two-core machine holds
  it. The activation-rounding rows use the snapshot on layer 0's ``q_proj`` and 16 random
  bf16 tokens, against float32 with the dequantized weight.
- **Recorded** (``results/quant-smollm2-135m.json``): ``nanoserve bench quant`` on the
  SmolLM2-135M shape against llama.cpp in its own venv, which no CI machine has. The file is the
  bench's JSON with ``machine``, ``date``, ``command`` and ``values`` added; ``values`` maps each
  row label to its stated text, computed from the bench's rows by ``recorded_values``. One
  recorded claim is made per value, so the rows follow the file: after a new bench run,

      python -m chapters.day75_bytes_buy.claims --record build/bench/quant-smollm2-135m.json

  rewrites the results file and prints the table rows to paste over the recorded ones.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import tempfile
from pathlib import Path

import torch

from chapters.runner import exact, recorded, timed

from .snapshot.roofline import ceiling, int8_blocks

HERE = Path(__file__).resolve().parent
RESULTS = "quant-smollm2-135m.json"
SMALL = "8 SmolLM2-135M layers, vocabulary 8,192"
PAIRS = (("bf16", "BF16"), ("w8a16", "Q8_0"), ("w4a16", "Q4_0"))
PROMPT, NEW, ROUNDS = 16, 64, 5
COMMAND = ("nanoserve bench quant --threads 1,2 --rounds 3 --llamacpp-venv .venv-llamacpp "
           "--offline --vllm --vllm-venv .venv-vllm (make bench-peers)")


# ------------------------------------------------------------------ the small model, rerun


@functools.cache
def folders() -> dict[str, Path]:
    """The small model in bf16 and w4a16 (group 32, head bf16), written once per process."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from nanoserve.bench.shapes import SMOLLM2_135M
    from nanoserve.quantize.command import quantize_checkpoint

    hf_logging.disable_progress_bar()
    root = Path(tempfile.mkdtemp(prefix="nanoserve-day75-"))
    cfg = {k: v for k, v in SMOLLM2_135M.items()
           if k not in ("architectures", "model_type", "torch_dtype")}
    cfg.update(num_hidden_layers=8, vocab_size=8192)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **cfg))
    model.to(torch.bfloat16).save_pretrained(root / "bf16")
    del model
    quantize_checkpoint(root / "bf16", root / "w4a16", "w4a16", 32)
    return {"bf16": root / "bf16", "w4a16": root / "w4a16"}


@functools.cache
def small_bytes(name: str) -> dict:
    from nanoserve.bench.quant_arms import step_bytes

    return step_bytes(folders()[name])


def small_ceiling() -> float:
    return ceiling(small_bytes("bf16")["total"], small_bytes("w4a16")["total"])


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@functools.cache
def gguf_check() -> dict:
    """The w4a16 folder written as a Q4_0 GGUF, read back by the gguf package: how many linear
    weights dequantize to exactly the checkpoint's, and the linears' bytes in each."""
    import gguf
    import numpy as np

    from nanoserve.bench.gguf_export import export_gguf, gguf_name, read_checkpoint, rope_rows
    from nanoserve.bench.quant_arms import is_linear

    path = folders()["w4a16"].parent / "w4a16-q4_0.gguf"
    if not path.is_file():
        export_gguf(folders()["w4a16"], path)
    config, hf = read_checkpoint(folders()["w4a16"])
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    same = total = file_bytes = ours = 0
    for name, qw in hf.items():
        if not is_linear(name):
            continue
        t = tensors[gguf_name(name)]
        got = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type),
                                        dtype=np.float32)).reshape(qw.shape)  # (N, K)
        want = qw.dequantize(torch.float32)
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's rotary row order
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            want = want[rope_rows(want.shape[0], heads)]
        total += 1
        same += torch.equal(got, want)
        file_bytes += int(t.n_bytes)
        ours += qw.nbytes()
    return {"same": same, "total": total, "file_bytes": file_bytes, "nbytes": ours}


@functools.cache
def activation_errors() -> dict:
    """Layer 0's q_proj at w4a16 and 16 random tokens in bf16: the output error, relative to
    float32 with the dequantized weight, of nanoserve's kernel (the weight widened in registers,
    the output rounded to bf16) and of the activations rounded to int8 blocks as Q8_0 stores
    them (the product then exact)."""
    from nanoserve.bench.gguf_export import read_checkpoint

    _, hf = read_checkpoint(folders()["w4a16"])
    qw = hf["model.layers.0.self_attn.q_proj.weight"]
    w = qw.dequantize(torch.float32)  # (576, 576)
    x = torch.randn(16, w.shape[1], generator=torch.Generator().manual_seed(0))  # (16, 576)
    x = x.to(torch.bfloat16).float()  # the activations as a bf16 model holds them
    exact_y = x @ w.T
    from nanoserve.cpu import quant_gemm as qg  # nanoserve's w4a16 kernel: bf16 in, bf16 out

    scale, zero = qg.pack_scales(qw.scale, None)
    widened_y = qg.gemm(x.bfloat16(), qg.pack(qw.q, 4), scale, zero, 4, 32, None,
                        w.shape[0]).float()

    def rel(y):
        return ((y - exact_y).norm() / exact_y.norm()).item()

    return {"widened": rel(widened_y), "int8": rel(int8_blocks(x) @ w.T)}


@functools.cache
def decode_speeds() -> dict[str, float]:
    """Decode tokens/s of bf16 and w4a16, one thread pinned to one CPU, best of interleaved
    rounds."""
    from chapters.common import best_of
    from nanoserve.bench.quant_arms import NanoserveArm

    cpus = (min(os.sched_getaffinity(0)),)
    arms = {k: NanoserveArm(p, cpus) for k, p in folders().items()}
    prompt = torch.randint(0, 8192, (PROMPT,), generator=torch.Generator().manual_seed(0))
    prompt = prompt.tolist()
    for a in arms.values():
        a.run(prompt, 8)  # warm-up
    best = best_of(ROUNDS, {k: (lambda a=a: a.run(prompt, NEW)) for k, a in arms.items()},
                   lambda r: r["decode_s"])
    for a in arms.values():
        a.close()
    return {k: r["decode_tokens_per_s"] for k, r in best.items()}


def kernel_missing() -> str | None:
    from nanoserve.cpu.quant_gemm import unavailable

    return unavailable(4, torch.bfloat16)


def decode_ratio() -> float:
    s = decode_speeds()
    return s["w4a16"] / s["bf16"]


# ------------------------------------------------------------------ the recorded bench


def _threads(t: int) -> str:
    return f"{t} thread" + ("s" if t > 1 else "")


def recorded_values(report: dict) -> dict[str, str]:
    """Each row label of the recorded table -> its stated text, from ``bench quant``'s JSON."""
    values = {}
    hw = report["hardware"]
    peer = next((r["version"] for r in report["rows"] if r.get("version")), "no llama.cpp")
    values["machine and peer of the recorded run"] = \
        f"{hw['cpu']}, {hw['cores']} cores, torch {hw['torch']}, {peer}"
    sb = report["step_bytes"]
    values["bytes one decode step reads, SmolLM2-135M: bf16, w8a16, w4a16 (group 32, bf16 "
           "head)"] = ", ".join(f"{sb[k]['total'] / 1e6:.1f}" for k, _ in PAIRS) + " MB"
    values["byte ceiling against bf16, SmolLM2-135M: w8a16, w4a16"] = ", ".join(
        f"{sb['bf16']['total'] / sb[k]['total']:.2f}x" for k, _ in PAIRS[1:])
    by = {(r["engine"], r["weights"], r["threads"]): r for r in report["rows"]}
    for t in report["threads"]:
        where = f"SmolLM2-135M, {_threads(t)}"
        for ours, theirs in PAIRS:
            a, b = by.get(("nanoserve", ours, t)), by.get(("llamacpp", ours, t))
            if not (a and b):
                continue
            if not (a.get("decode_tokens_per_s") and b.get("decode_tokens_per_s")):
                values[f"decode tokens/s, {where}: nanoserve {ours}, llama.cpp {theirs}"] = \
                    f"{a['status']}, {b['status']}"
                continue
            values[f"decode tokens/s, {where}: nanoserve {ours}, llama.cpp {theirs}"] = \
                f"{a['decode_tokens_per_s']:.1f}, {b['decode_tokens_per_s']:.1f}"
            values[f"decode tokens/s, nanoserve {ours} / llama.cpp {theirs}, {where}"] = \
                f"{a['ratio_over_llamacpp']:.2f}x"
            if ours != "bf16":
                values[f"share of the byte ceiling reached, {where}: nanoserve {ours}, "
                       f"llama.cpp {theirs}"] = \
                    f"{a['fraction_of_ceiling']:.0%}, {b['fraction_of_ceiling']:.0%}"
            if a.get("greedy_tokens_shared_with_llamacpp") is not None:
                values[f"greedy tokens before the first difference, nanoserve {ours} and "
                       f"llama.cpp {theirs}, {where}"] = \
                    f"{a['greedy_tokens_shared_with_llamacpp']} of " \
                    f"{report['workload']['new_tokens']}"
    off = report.get("offline")
    for r in (off or {}).get("rows", []):
        if r["weights"] == "bf16" and r["status"] == "ok":
            continue
        label = (f"8 rows, SmolLM2-135M, {_threads(off['threads'])}: {r['engine']} "
                 f"{r['weights']}, decode and prefill tokens/s over bf16")
        values[label] = (f"{r['decode_over_bf16']:.2f}x, {r['prefill_over_bf16']:.2f}x"
                         if "decode_over_bf16" in r else r["status"])
    return values


def record(bench_json: Path, command: str = COMMAND, date: str | None = None) -> dict:
    """``bench quant``'s JSON with the fields a recorded claim needs, written to results/."""
    report = json.loads(Path(bench_json).read_text())
    hw = report["hardware"]
    out = {"machine": f"{hw['cpu']}, {hw['cores']} cores, no GPU",
           "date": date or datetime.date.today().isoformat(), "command": command,
           "values": recorded_values(report), **report}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / RESULTS).write_text(json.dumps(out, indent=1) + "\n")
    return out


def recorded_claims() -> list:
    path = HERE / "results" / RESULTS
    if not path.is_file():
        return []
    return [recorded(label, RESULTS, label) for label in json.loads(path.read_text())["values"]]


CLAIMS = [
    exact(f"bytes one decode step reads, {SMALL}: bf16",
          lambda: megabytes(small_bytes("bf16")["total"])),
    exact(f"bytes one decode step reads, {SMALL}: w4a16 group 32, bf16 head",
          lambda: megabytes(small_bytes("w4a16")["total"])),
    exact(f"byte ceiling against bf16, {SMALL}: w4a16 group 32, bf16 head",
          lambda: f"{small_ceiling():.2f}x"),
    exact(f"share of a w4a16 step's bytes read by the bf16 head, {SMALL}",
          lambda: f"{small_bytes('w4a16')['head'] / small_bytes('w4a16')['total']:.0%}"),
    exact(f"linear weights of the Q4_0 GGUF that dequantize to exactly the w4a16 checkpoint's, "
          f"{SMALL}", lambda: f"{gguf_check()['same']} of {gguf_check()['total']}"),
    exact(f"bytes of those linears: in the Q4_0 GGUF, by QuantizedWeight.nbytes, {SMALL}",
          lambda: f"{gguf_check()['file_bytes']:,}, {gguf_check()['nbytes']:,}"),
    exact("output error against float32, layer 0 q_proj at w4a16, 16 random tokens: "
          "nanoserve's kernel, bf16 activations", lambda: f"{activation_errors()['widened']:.2%}",
          needs=kernel_missing),
    exact("output error against float32, layer 0 q_proj at w4a16, 16 random tokens: "
          "activations rounded to int8 blocks of 32 (Q8_0)",
          lambda: f"{activation_errors()['int8']:.2%}"),
    timed(f"decode tokens/s, w4a16 / bf16, {SMALL}, one request, 1 thread", decode_ratio,
          fmt="{:.2f}x".format),
    *recorded_claims(),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="write results/quant-smollm2-135m.json from a "
                                            "bench quant JSON and print the table rows")
    p.add_argument("--record", required=True, help="bench quant's --out JSON")
    p.add_argument("--command", default=COMMAND)
    p.add_argument("--date", default=None)
    args = p.parse_args(argv)
    out = record(Path(args.record), args.command, args.date)
    for label, stated in out["values"].items():
        print(f"| {label} | {stated} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
