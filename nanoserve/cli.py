"""The ``nanoserve`` command.

Why this module exists: an engine should be usable without writing Python. ``nanoserve generate``
runs the offline API on one prompt and prints the continuation, with the numbers an operator
wants (prompt and generated tokens, wall time, tokens per second) on stderr.

    nanoserve generate "The while statement" --max-tokens 60 --temperature 0
    nanoserve serve --port 8000                      # the OpenAI-compatible server
    nanoserve bench sched --slots 4 --pool-tokens 96 --gen-lens 24 --requests 4 --json
    nanoserve quantize MODEL OUT --scheme w4a16 --group-size 32   # a compressed-tensors copy
"""

from __future__ import annotations

import argparse
import sys
import time

GENERATE_DEFAULTS = {"temperature": 0.0, "max_tokens": 64}  # greedy, unless told otherwise


def _generate(args: argparse.Namespace) -> int:
    from nanoserve.config import EngineConfig
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    # a flag given wins, then the checkpoint's generation_config.json, then these
    asked = {k: v for k, v in dict(temperature=args.temperature, top_p=args.top_p,
                                   top_k=args.top_k, max_tokens=args.max_tokens).items()
             if v is not None}
    fixed = dict(seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)
    try:
        params = SamplingParams(**{**GENERATE_DEFAULTS, **asked}, **fixed)  # refused before load
        t0 = time.perf_counter()
        llm = LLM.from_config(EngineConfig.from_cli_args(args))
        params = SamplingParams(**{**GENERATE_DEFAULTS, **llm.generation_defaults, **asked},
                                **fixed)
        t1 = time.perf_counter()
        prompt = args.prompt
        if args.chat:  # the template writes BOS itself: encode without adding another
            prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                       tokenize=True)
        out = llm.generate([prompt], params)[0]
        t2 = time.perf_counter()
    except ValueError as e:
        print(f"nanoserve: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.prompt}{out.text}")
    n = len(out.token_ids)
    print(f"[{len(out.prompt_token_ids)} prompt + {n} generated tokens, "
          f"finish_reason={out.finish_reason}; load {t1 - t0:.2f}s, "
          f"generate {t2 - t1:.2f}s, {n / (t2 - t1):.1f} tok/s]", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nanoserve", description="nanoserve: an LLM engine",
                                 allow_abbrev=False)
    sub = ap.add_subparsers(dest="command", required=True)
    # allow_abbrev=False: a misspelt flag (--max-num-seq) is refused, never read as another
    g = sub.add_parser("generate", help="continue one prompt with the offline engine",
                       allow_abbrev=False)
    g.add_argument("prompt")
    said = "default: generation_config.json's, else"
    g.add_argument("--max-tokens", type=int, default=None, help=f"({said} 64)")
    g.add_argument("--temperature", type=float, default=None, help=f"({said} 0: greedy)")
    g.add_argument("--top-p", type=float, default=None, help=f"({said} 1)")
    g.add_argument("--top-k", type=int, default=None, help=f"({said} 0: off)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    from nanoserve.config import EngineConfig
    from nanoserve.entrypoints.openai import serve

    EngineConfig.add_cli_args(g)  # --model, --dtype, --no-kv-cache, ...: the engine's options

    serve.add_arguments(sub.add_parser("serve", help="the OpenAI-compatible HTTP server",
                                       allow_abbrev=False))
    from nanoserve.quantize import command as quantize

    quantize.add_arguments(sub.add_parser("quantize", help="write a compressed-tensors "
                                          "checkpoint (w8a16, w4a16, w8a8)", allow_abbrev=False))
    b = sub.add_parser("bench", help="benchmarks and harnesses")
    bsub = b.add_subparsers(dest="bench", required=True)
    from nanoserve.bench import (
        batchbench,
        graphbench,
        offline,
        quant,
        schedbench,
        serve_pair,
        soak,
        spec,
        stress,
        structured,
        tpbench,
    )
    from nanoserve.bench import serve_cli as serve_bench

    schedbench.add_arguments(bsub.add_parser("sched", help="the scheduler without a model"))
    batchbench.add_arguments(bsub.add_parser("batch", help="the engine on a seeded workload"))
    stress.add_arguments(bsub.add_parser("stress", help="cramped vs roomy, with aborts"))
    graphbench.add_arguments(bsub.add_parser("graph", help="decode steps a graph can replay, "
                                                          "free rows vs persistent batch"))
    serve_bench.add_arguments(bsub.add_parser("serve", help="a seeded load over HTTP, per rate"))
    serve_pair.add_arguments(bsub.add_parser("serve-pair", help="nanoserve's server and a "
                                             "peer's, both up, in alternating rounds"))
    soak.add_arguments(bsub.add_parser("soak", help="thousands of requests, hang-ups, no leaks"))
    offline.add_arguments(bsub.add_parser("offline", help="nanoserve vs transformers and vLLM, "
                                                     "one ragged workload, same run"))
    tpbench.add_arguments(bsub.add_parser("tp", help="R ranks x C/R threads against 1 rank x C "
                                          "threads; a decode step's bytes and comm time"))
    quant.add_arguments(bsub.add_parser("quant", help="quantized decode vs bf16, the byte "
                                        "ceiling and llama.cpp on the same weights"))
    spec.add_arguments(bsub.add_parser("spec", help="speculative decoding (ngram, a draft "
                                       "model) against none, and against vLLM's"))
    structured.add_arguments(bsub.add_parser("structured", help="a grammar's cost per decode "
                                             "step and per request, against none"))
    args = ap.parse_args(argv)
    if args.command == "serve":
        return serve.main(args)
    if args.command == "quantize":
        return quantize.main(args)
    if args.command == "bench":
        return {"sched": schedbench, "batch": batchbench, "stress": stress, "graph": graphbench,
                "serve": serve_bench, "serve-pair": serve_pair, "soak": soak, "tp": tpbench,
                "offline": offline, "structured": structured,
                "quant": quant, "spec": spec}[args.bench].main(args)
    return _generate(args)


if __name__ == "__main__":
    sys.exit(main())
