"""``nanoserve bench quant``: quantized decode against bf16, the byte ceiling and llama.cpp.

Why this module exists: issue 40's targets are ratios, each measured in one run on one machine:
a quantized model's decode speed against bf16's, against the byte ceiling (bf16's bytes per
step over the quantized model's: a step reads every weight once), and against llama.cpp on the
same weights at equal bytes (Q8_0 is w8a16 group 32, Q4_0 is w4a16 group 32, both with the
head in bf16). The command builds everything from one random checkpoint in a published shape
(``shapes.py``):

- the dense bf16 folder; W8A16 and W4A16 (group 32, symmetric) and W8A8 (per channel) folders
  written by ``nanoserve quantize`` (compressed-tensors, round-to-nearest, head left bf16);
- GGUFs of the dense, W8A16 and W4A16 folders (``gguf_export.py``: BF16, Q8_0, Q4_0 from the
  checkpoint's own integers and scales);
- the decode arms (``quant_arms.py``): one request, ``--prompt-len`` random prompt ids,
  ``--new-tokens`` greedy tokens with EOS ignored, at each ``--threads`` count (threads pinned
  one a core, llama.cpp's process pinned to the same cores), the arms interleaved round by
  round; each arm's figure is its best round;
- with ``--offline``, ``bench offline``'s 8-row workload (decode) and the same prompts with one
  new token (prefill) through ``runner.run_offline`` on the bf16, W4A16 and W8A8 folders, with
  vLLM's CPU build beside nanoserve where ``--vllm`` asks (its row records the error where it
  does not load a checkpoint).

An arm that cannot run is a row that says why, never a number. The table goes to stderr, the
report to ``--out`` (JSON), and with ``--json`` to stdout.

    nanoserve bench quant --threads 1,2 --rounds 3
    nanoserve bench quant --offline --vllm --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from nanoserve.bench.adapters import DEFAULT_VLLM_VENV
from nanoserve.bench.quant_report import offline_section, print_report
from nanoserve.bench.shapes import ROOT, SHAPE_CACHE, SHAPES, shape_checkpoint

DEFAULT_LLAMACPP_VENV = ROOT / ".venv-llamacpp"
SCHEMES = ("w8a16", "w4a16")  # the decode arms' quantized schemes; GGUF type beside each
GGUF_TYPE = {"bf16": "BF16", "w8a16": "Q8_0", "w4a16": "Q4_0"}
# the shapes the GGUF writer takes: Llama without rope scaling
LLAMA_SHAPES = sorted(k for k, v in SHAPES.items()
                      if v["model_type"] == "llama" and not v.get("rope_scaling"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=LLAMA_SHAPES, default="smollm2-135m")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--engines", default="nanoserve,llamacpp",
                   help="decode arms' engines: nanoserve, llamacpp")
    p.add_argument("--llamacpp-venv", default=str(DEFAULT_LLAMACPP_VENV))
    p.add_argument("--offline", action="store_true",
                   help="also the 8-row workload: bf16 vs w4a16 decode, bf16 vs w8a8 prefill")
    p.add_argument("--offline-threads", type=int, default=1)
    p.add_argument("--vllm", action="store_true", help="vLLM's CPU build in the 8-row rows")
    p.add_argument("--vllm-venv", default=str(DEFAULT_VLLM_VENV))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON report (default build/bench/quant-SHAPE"
                                               ".json)")
    p.add_argument("--json", action="store_true", help="print the report on stdout too")


def make_models(shape: str, seed: int = 0) -> dict:
    """The shape's dense folder, its quantized folders and the GGUFs, made once under build/."""
    from nanoserve.bench.gguf_export import export_gguf
    from nanoserve.quantize.command import quantize_checkpoint

    dense = shape_checkpoint(shape, seed=seed)
    folders = {"bf16": dense}
    for name in (*SCHEMES, "w8a8"):
        out = SHAPE_CACHE / f"{dense.name}-{name}{'-g32' if name != 'w8a8' else ''}"
        if not (out / "config.json").is_file():  # made once; the tied head stays bf16
            quantize_checkpoint(dense, out, name, 32 if name != "w8a8" else "channel")
        folders[name] = out
    ggufs = {}
    for name in ("bf16", *SCHEMES):
        path = SHAPE_CACHE / "gguf" / f"{dense.name}-{GGUF_TYPE[name].lower()}.gguf"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            export_gguf(folders[name], tmp)
            tmp.rename(path)
        ggufs[name] = path
    return {"folders": folders, "ggufs": ggufs}


def _arm(engine: str, name: str) -> str:
    return f"{engine} {name if engine == 'nanoserve' else GGUF_TYPE[name]}"


def decode_section(models: dict, threads: list[int], rounds: int, prompt: list[int],
                   new_tokens: int, engines: list[str], llamacpp_venv: Path, log) -> list[dict]:
    """Every decode arm at every thread count, rounds interleaved; one row per arm and count."""
    from nanoserve.bench.quant_arms import NanoserveArm, llamacpp_run

    rows = []
    for t in threads:
        cpus = tuple(sorted(os.sched_getaffinity(0)))[:t]
        arms: dict[str, dict] = {}
        live: dict[str, NanoserveArm] = {}
        for name in ("bf16", *SCHEMES):
            for engine in engines:
                arm = arms[_arm(engine, name)] = {
                    "arm": _arm(engine, name), "engine": engine, "weights": name,
                    "threads": t, "cpus": list(cpus), "status": "ok", "rounds": []}
                if engine != "nanoserve":
                    continue
                log(f"{t} thread(s): loading {arm['arm']}")
                try:
                    live[arm["arm"]] = NanoserveArm(models["folders"][name], cpus)
                    arm["binding"] = live[arm["arm"]].describe
                except Exception as e:  # quantized loading not landed, say: the row says so
                    arm.update(status="error", reason=f"{type(e).__name__}: {e}"[:600])
        for one in live.values():  # warm-up, untimed (llama.cpp warms up in its process)
            one.run(prompt, 8)
        order = [k for k, a in arms.items() if a["status"] == "ok"]
        for r in range(rounds):
            k = r % max(1, len(order))
            for key in order[k:] + order[:k]:
                arm = arms[key]
                if arm["status"] != "ok":
                    continue
                log(f"{t} thread(s), round {r + 1}/{rounds}: {key}")
                try:
                    if arm["engine"] == "nanoserve":
                        got = live[key].run(prompt, new_tokens)
                    else:
                        got = llamacpp_run(llamacpp_venv, models["ggufs"][arm["weights"]],
                                           prompt, new_tokens, cpus)
                        arm["version"] = got["version"]
                        got = {**got["rounds"][0], "tokens": got["tokens"]}
                except Exception as e:
                    arm.update(status="error", reason=f"round {r + 1}: {type(e).__name__}: "
                                                      f"{e}"[:600])
                    continue
                arm["tokens"] = got.pop("tokens")
                arm["rounds"].append(got)
        for arm in live.values():
            arm.close()
        rows.extend(arms.values())
    return rows


def main(args: argparse.Namespace) -> int:
    from nanoserve.bench.hardware import hardware
    from nanoserve.bench.quant_report import summarize

    try:
        threads = [int(x) for x in args.threads.split(",") if x.strip()]
        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        if not threads or min(threads) < 1 or max(threads) > len(os.sched_getaffinity(0)):
            raise ValueError(f"--threads {args.threads}: counts from 1 to "
                             f"{len(os.sched_getaffinity(0))} (the usable cores)")
        if set(engines) - {"nanoserve", "llamacpp"} or args.rounds < 1:
            raise ValueError(f"--engines {args.engines} / --rounds {args.rounds}: engines from "
                             f"nanoserve, llamacpp; rounds >= 1")
    except ValueError as e:
        print(f"nanoserve bench quant: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] bench quant: {msg}", file=sys.stderr,
              flush=True)

    log(f"models for {args.shape}")
    models = make_models(args.shape, args.seed)
    from nanoserve.bench.quant_arms import step_bytes

    config = json.loads((models["folders"]["bf16"] / "config.json").read_text())
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, config["vocab_size"], (args.prompt_len,), generator=g).tolist()
    hw = hardware("cpu")
    report = {
        "hardware": hw, "shape": args.shape, "dtype": "bfloat16 activations",
        "models": {k: str(v) for k, v in models["folders"].items()},
        "ggufs": {k: str(v) for k, v in models["ggufs"].items()},
        "workload": {"requests": 1, "prompt_len": args.prompt_len,
                     "new_tokens": args.new_tokens, "greedy": True, "ignore_eos": True,
                     "seed": args.seed, "rounds": args.rounds, "figure": "best round"},
        "step_bytes": {k: step_bytes(models["folders"][k]) for k in ("bf16", *SCHEMES)},
        "threads": threads,
    }
    report["rows"] = decode_section(models, threads, args.rounds, prompt, args.new_tokens,
                                    engines, Path(args.llamacpp_venv), log)
    summarize(report)
    if args.offline:
        report["offline"] = offline_section(models["folders"], args.offline_threads,
                                            args.rounds, args.vllm, Path(args.vllm_venv), log)
    hw["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    out = Path(args.out) if args.out else ROOT / "build" / "bench" / f"quant-{args.shape}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print_report(report)
    log(f"report in {out}")
    if args.json:
        print(json.dumps(report))
    return 0
