"""``nanoserve bench offline``: nanoserve against its peers on one ragged workload, same run.

Why this module exists: a speed is only worth quoting as a ratio against a peer measured in the
same run, on the same checkpoint, the same prompts and the same hardware. This is the command
that sets such a run up and reports it; the parts live beside it:

- ``shapes.py``: ``--shape``, random weights in a published checkpoint's exact shape;
- ``workload.py``: ``make_workload``, by default 16 seeded requests, prompts of 16-192 tokens,
  16-128 new tokens each, greedy with EOS ignored;
- ``adapters.py`` (and ``vllm_engine.py``): the engines ``nanoserve``, ``hf`` (static waves),
  ``hf-cb`` (transformers' continuous batching) and ``vllm`` (its CPU build, in ``.venv-vllm``),
  each given at most ``--batch`` rows at a time;
- ``runner.py``: ``run_offline``, a warm-up, then ``--rounds`` rounds in rotating order;
- ``hardware.py``: the machine the table names.

``--attention``, ``--compile`` and each ``--llm-option KEY=VALUE`` go straight to nanoserve's
``LLM``; one it does not know is an error, not a silent default. The table (stderr) names the
hardware, dtype, model, workload, batch size and each engine's threads; ``--json`` prints the
same on stdout; ``--record`` writes it as a chapter's results file.

Threads are part of the result, so every row names its own. The in-process engines use torch's
default (every core) unless ``--threads N`` says otherwise, and nanoserve's row says where its
threads are pinned (``threads_bind``, ``--llm-option threads_bind=nobind`` to compare); vLLM binds
its OpenMP threads itself
(on x86 it keeps one core for its scheduler process, so on 2 cores it computes on 1). On a CPU
that other work shares, OpenMP threads that spin waiting for a descheduled sibling can make a
small model many times slower: compare at equal threads (``--threads`` = vLLM's count) too.

    nanoserve bench offline --engines nanoserve,hf,hf-cb --json
    nanoserve bench offline --shape smollm2-135m --dtype bfloat16 --requests 8 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from nanoserve.bench.adapters import DEFAULT_VLLM_VENV, ENGINES, Setup
from nanoserve.bench.hardware import describe_hardware, hardware
from nanoserve.bench.runner import run_offline
from nanoserve.bench.shapes import SHAPES, shape_checkpoint
from nanoserve.bench.workload import Workload, make_workload
from nanoserve.config import DEFAULT_MODEL


def _pair(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX, got {text!r}") from None
    return lo, hi


def _json_or_str(text: str) -> object:
    """``true``, ``8``, ``null`` as JSON; anything else as the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.replace("-", "_"), _json_or_str(value)


def workload_for(model: Path, requests: int = 16, prompt_lens: tuple[int, int] = (16, 192),
                 gen_lens: tuple[int, int] = (16, 128), seed: int = 0) -> tuple[Workload, int]:
    """The seeded workload over the checkpoint's vocabulary, and the ``max_model_len`` it
    needs (refused where the model has fewer positions)."""
    config = json.loads((Path(model) / "config.json").read_text())
    wl = make_workload(requests, prompt_lens, gen_lens, config["vocab_size"], seed)
    if wl.max_len > config["max_position_embeddings"]:
        raise ValueError(f"the workload needs {wl.max_len} positions; the model has "
                         f"{config['max_position_embeddings']}")
    return wl, wl.max_len


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="checkpoint folder (default: the shipped nanoserve-tiny)")
    p.add_argument("--shape", choices=["tiny", *SHAPES], default=None,
                   help="random weights in this exact shape, cached under build/")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--device", default=None, help="default: cuda where present, else cpu")
    p.add_argument("--engines", default="nanoserve,hf,hf-cb,vllm",
                   help=f"comma-separated, from {','.join(ENGINES)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-lens", type=_pair, default=(16, 192), help="MIN,MAX prompt tokens")
    p.add_argument("--gen-lens", type=_pair, default=(16, 128), help="MIN,MAX new tokens")
    p.add_argument("--batch", type=int, default=8, help="rows at a time, every engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for the in-process engines (default: torch's own)")
    p.add_argument("--attention", default=None, help="passed to nanoserve's LLM when given")
    p.add_argument("--compile", nargs="?", const=True, default=None, type=_json_or_str,
                   help="passed to nanoserve's LLM when given (a bare flag means True)")
    p.add_argument("--llm-option", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="more keyword arguments for nanoserve's LLM")
    p.add_argument("--vllm-venv", default=str(DEFAULT_VLLM_VENV))
    p.add_argument("--vllm-option", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="more keyword arguments for vllm.LLM")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--record", default=None, metavar="PATH",
                   help="also write the report as a chapter's results file (machine, date, "
                        "command, values)")


def main(args: argparse.Namespace) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.model and args.shape:
        print("nanoserve bench offline: error: give --model or --shape, not both",
              file=sys.stderr)
        return 2
    try:
        model = Path(args.model) if args.model else (
            shape_checkpoint(args.shape) if args.shape else DEFAULT_MODEL)
        wl, max_model_len = workload_for(model, args.requests, args.prompt_lens, args.gen_lens,
                                         args.seed)
        if args.batch < 1:
            raise ValueError(f"--batch must be >= 1, got {args.batch}")
        options = dict(args.llm_option)
        for key in ("attention", "compile"):
            if getattr(args, key) is not None:
                options[key] = getattr(args, key)
        setup = Setup(model, args.dtype, device, args.batch, max_model_len, options,
                      Path(args.vllm_venv), dict(args.vllm_option))
        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        hw = hardware(device)
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            with console.status("") as status:
                result = run_offline(setup, wl, engines, args.rounds, not args.no_warmup,
                                     log=lambda m: status.update(f"bench offline: {m}"))
        else:  # a log: one line per step, with the time, so a slow step shows where it is
            t0 = time.perf_counter()
            result = run_offline(
                setup, wl, engines, args.rounds, not args.no_warmup,
                log=lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] bench offline: {m}",
                                    file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"nanoserve bench offline: error: {e}", file=sys.stderr)
        return 2
    hw["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    report = {"hardware": hw, "model": str(model), "shape": args.shape,
              "model_name": args.shape or model.name, "dtype": args.dtype,
              "workload": {"requests": args.requests, "prompt_lens": list(wl.prompt_lens),
                           "gen_lens": list(wl.gen_lens), "seed": wl.seed,
                           "useful_tokens": wl.useful_tokens, "batch": args.batch,
                           "max_model_len": max_model_len},
                "rounds": args.rounds, "rows": result["rows"],
                "ratios": {r["engine"]: r["nanoserve_ratio"] for r in result["rows"]
                           if r["engine"] != "nanoserve" and r["nanoserve_ratio"]}}
    print_table(report, console)
    if args.json:
        print(json.dumps(report))
    if args.record:
        command = "nanoserve bench offline " + " ".join(sys.argv[1:]).split("bench offline ")[-1]
        Path(args.record).write_text(json.dumps(as_record(report, command), indent=1) + "\n")
    return 0 if all(r["status"] != "error" for r in result["rows"]) else 1


def as_record(report: dict, command: str, date: str | None = None) -> dict:
    """A report as a chapter's ``recorded`` results file: the machine, the date and the command
    that made it, the ratios under ``values`` (``ratio_hf``, ``ratio_hf_cb``, ``ratio_vllm``)
    with each engine's tokens/s, and the whole report beside them."""
    import datetime

    hw = report["hardware"]
    values = {f"ratio_{e.replace('-', '_')}": r for e, r in report["ratios"].items()}
    values.update({f"tokens_per_s_{r['engine'].replace('-', '_')}": r["tokens_per_s"]
                   for r in report["rows"] if r["status"] == "ok"})
    return {"machine": f"{platform.machine()} {hw['cpu']}, {hw['cores']} cores, "
                       + (hw.get("gpu") or "no GPU"),
            "date": date or datetime.date.today().isoformat(), "command": command,
            "values": values, "report": report}


def print_table(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console(stderr=True)
    if not console.is_terminal:  # a log or a pipe: wide enough for the table, not 80
        console = Console(stderr=True, width=132)
    w, hw = report["workload"], report["hardware"]
    table = Table(
        title=f"nanoserve bench offline: {report['model_name']}, {report['dtype']}, "
              f"{w['batch']} rows at a time, on {hw['device']}",
        caption=f"Hardware: {describe_hardware(hw)} (after the run: "
                f"{hw.get('loadavg_1m_after', '?')}).\nWorkload: {w['requests']} requests, "
                f"prompts {w['prompt_lens'][0]}-{w['prompt_lens'][1]} tokens, outputs "
                f"{w['gen_lens'][0]}-{w['gen_lens'][1]} ({w['useful_tokens']} useful tokens), "
                f"greedy, EOS ignored, seed {w['seed']}; the median of {report['rounds']} "
                f"interleaved rounds after a warm-up.",
        caption_justify="left")
    for col, justify in (("engine", "left"), ("version", "left"), ("threads", "left"),
                         ("useful tok/s", "right"), ("each round", "right"),
                         ("nanoserve / it", "right"), ("same tokens", "right")):
        table.add_column(col, justify=justify, overflow="fold")
    notes = []
    for r in report["rows"]:
        if r["status"] != "ok":
            table.add_row(r["engine"], r["version"] or "", r["threads"] or "", r["status"],
                          "", "", "")
            notes.append(f"{r['engine']}: {r['status']}: {r['reason']}")
            continue
        same = r.get("same_tokens_as_nanoserve")
        extra = list(r["notes"])
        if "static_waves" in r:
            sw = r["static_waves"]
            extra.append(f"{sw['computed_tokens']} row-tokens decoded for "
                         f"{sw['useful_tokens']} useful")
        if extra:
            notes.append(f"{r['engine']}: " + "; ".join(extra))
        table.add_row(r["engine"], r["version"], r["threads"], f"{r['tokens_per_s']:.1f}",
                      " ".join(f"{x:.0f}" for x in r["tokens_per_s_rounds"]),
                      f"{r['nanoserve_ratio']:.2f}x" if r["nanoserve_ratio"] else "",
                      "" if same is None else f"{same}/{w['requests']}")
    console.print(table)
    for line in notes:
        console.print(f"  {line}", highlight=False, markup=False)
