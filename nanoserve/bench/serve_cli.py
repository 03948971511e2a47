"""``nanoserve bench serve``: the serving benchmark's flags, and its table and JSON.

Why this module exists: the benchmark (``serve.py``) is a function, ``run_bench``; this is the
command line in front of it. Its flags are vLLM's ``vllm bench serve`` flags where vLLM has them
(``--dataset-name``, ``--prefix-repetition-*``, ``--max-concurrency``, ``--burstiness``), then
every engine flag of ``nanoserve serve`` for the server it starts without ``--url``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from nanoserve.bench.local_server import engine_argv, engine_options_set
from nanoserve.bench.serve_metrics import print_table, rounded
from nanoserve.bench.workload import DATASETS


def rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates takes numbers or inf, got {text!r}") from None
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"--rates must be positive, got {text!r}")
    return rates


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's flags, then ``nanoserve serve``'s engine flags for the server it starts
    without ``--url`` (``--model`` also gives the prompts' vocabulary, with ``--url`` too)."""
    from nanoserve.config import EngineConfig

    p.add_argument("--url", default=None,
                   help="server base URL; without it --model is served on 127.0.0.1 with the "
                        "engine options below")
    p.add_argument("--served-model-name", default=None,
                   help="the request's model field (default: the first of /v1/models)")
    p.add_argument("--rates", type=rates, default=[1.0, 2.0, 4.0, math.inf],
                   help="comma-separated request rates per second; inf sends all at once")
    p.add_argument("--requests", type=int, default=64, help="requests per rate")
    p.add_argument("--dataset-name", choices=DATASETS, default="random",
                   help="random: vLLM's random ids; prefix_repetition: vLLM's shared prefixes; "
                        "long_among_short: short prompts streaming long replies, every k-th "
                        "a long prompt")
    p.add_argument("--input-len", type=int, default=64,
                   help="prompt ids (random; long_among_short: the short prompts)")
    p.add_argument("--output-len", type=int, default=32,
                   help="tokens out (random; long_among_short: the short prompts')")
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]")
    g = p.add_argument_group("prefix_repetition (vLLM's flags and defaults, but 8 prefixes)")
    g.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    g.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    g.add_argument("--prefix-repetition-num-prefixes", type=int, default=8,
                   help="distinct prefixes; --requests must be a multiple of it (vLLM's "
                        "default is 10; 8 divides the default 64 requests)")
    g.add_argument("--prefix-repetition-output-len", type=int, default=128)
    g = p.add_argument_group("long_among_short")
    g.add_argument("--long-among-short-prompt-len", type=int, default=768,
                   help="prompt ids of each long request")
    g.add_argument("--long-among-short-every", type=int, default=4,
                   help="every k-th request is long (k, 2k, ...): a share of 1/k")
    g.add_argument("--long-among-short-output-len", type=int, default=8,
                   help="tokens out of each long request")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the arrivals: 1 is Poisson, <1 burstier, >1 steadier")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                   help="send token ids, or text decoded from them with --model's tokenizer")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="draw prompt ids below this (default: --model's vocab_size)")
    p.add_argument("--request-timeout", type=float, default=120.0,
                   help="seconds a request may wait for its next byte")
    p.add_argument("--max-duration", type=float, default=600.0,
                   help="seconds per rate before unfinished requests count as failed")
    p.add_argument("--server-timeout", type=float, default=180.0,
                   help="seconds the started server has to turn healthy")
    p.add_argument("--json", action="store_true", help="print one JSON list on stdout")
    p.add_argument("--save-detailed", action="store_true",
                   help="the JSON also holds every request's lengths, times, text and error")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    EngineConfig.add_cli_args(p)


def dataset_options(args: argparse.Namespace) -> dict:
    """The chosen dataset's own flags, by ``workload.sample_requests``' names."""
    if args.dataset_name == "prefix_repetition":
        return {"prefix_len": args.prefix_repetition_prefix_len,
                "suffix_len": args.prefix_repetition_suffix_len,
                "num_prefixes": args.prefix_repetition_num_prefixes,
                "output_len": args.prefix_repetition_output_len}
    if args.dataset_name == "long_among_short":
        return {"long_len": args.long_among_short_prompt_len,
                "long_every": args.long_among_short_every,
                "long_output_len": args.long_among_short_output_len}
    return {}


def _workload_text(args: argparse.Namespace) -> str:
    o = dataset_options(args)
    if args.dataset_name == "prefix_repetition":
        return (f"prefix_repetition: {o['num_prefixes']} prefixes of {o['prefix_len']} + "
                f"suffixes of {o['suffix_len']} in/{o['output_len']} out")
    if args.dataset_name == "long_among_short":
        return (f"long_among_short: {args.input_len} in/{args.output_len} out, every "
                f"{o['long_every']}th {o['long_len']} in/{o['long_output_len']} out")
    return (f"random: {args.input_len} in/{args.output_len} out, range_ratio "
            f"{args.range_ratio}")


def main(args: argparse.Namespace) -> int:
    from nanoserve.bench.serve import run_bench

    try:
        results = run_bench(
            args.url, args.rates, args.requests, args.input_len, args.output_len,
            args.range_ratio, args.burstiness, args.max_concurrency, args.seed, args.model,
            args.served_model_name, args.vocab_size, args.prompt_format,
            request_timeout_s=args.request_timeout, max_duration_s=args.max_duration,
            server_timeout_s=args.server_timeout, progress=not args.no_progress,
            engine_args=tuple(engine_argv(engine_options_set(args))),
            dataset_name=args.dataset_name, dataset_options=dataset_options(args),
            detailed=args.save_detailed)
    except (ValueError, RuntimeError) as e:
        print(f"nanoserve bench serve: error: {e}", file=sys.stderr)
        return 2
    results = rounded(results)
    r0 = results[0]
    where = args.url or (f"a local nanoserve serve (device {args.device}, "
                         f"max_num_seqs {args.max_num_seqs}, {os.cpu_count()} host cores)")
    print_table(results, f"nanoserve bench serve: {r0['model']} on {where}; {args.requests} "
                         f"requests per rate of {_workload_text(args)}, burstiness "
                         f"{args.burstiness}, max_concurrency {args.max_concurrency}, seed "
                         f"{args.seed}")
    for r in results:
        for error, count in r["errors"].items():
            print(f"rate {r['rate']}: {count} failed: {error}", file=sys.stderr)
    if args.json:
        print(json.dumps(results))
    return 0 if all(r["failed"] == 0 for r in results) else 1
