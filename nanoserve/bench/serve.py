"""The serving benchmark: a seeded workload sent over HTTP at a chosen rate, timed by the client.

Why this module exists: an engine's own counters say how fast it steps; a user feels something
else, the time between sending a request and reading its tokens off a socket, with everybody
else's requests in the same batch. This is vLLM's ``benchmark_serving`` for nanoserve: it sends a
seeded workload (``workload.py``) to ``/v1/completions`` with ``stream: true`` and
``ignore_eos: true`` at each request rate in turn (Poisson arrivals, or gamma with
``burstiness``, or all at once for ``inf``), optionally capped at ``max_concurrency`` requests in
flight, and reports per rate, under vLLM's key names:

- TTFT, time to first token: request sent -> first content chunk read;
- ITL, inter-token latency: the gaps between content chunks, pooled over all requests;
- TPOT, time per output token: ``(e2el - ttft) / (output_tokens - 1)`` per request;
- E2EL, end-to-end latency: request sent -> stream closed;
- request, output-token and total-token throughput over the rate's wall time.

Output tokens come from the ``usage`` in the final chunk (``stream_options.include_usage``);
a server that sends none is counted by its content chunks. Percentiles are numpy's (linear
interpolation). Without ``--url`` the benchmark starts ``nanoserve serve`` on a free port of
127.0.0.1, waits for ``/health``, and stops it afterwards; the started server takes every engine
flag of ``nanoserve serve`` (``EngineConfig.add_cli_args``: ``--model``, ``--dtype``,
``--max-num-seqs``, ``--cuda-graphs``, ...), and the benchmark passes on those set away from their
defaults, spelt as that parser spells them.

    nanoserve bench serve --rates 1,4,inf --requests 64 --json
    nanoserve bench serve --url http://127.0.0.1:8000 --rates inf --max-concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import DEFAULT_MODEL
from . import run_sync
from .local_server import LocalServer, engine_argv, engine_options_set, local_server
from .workload import SampleRequest, arrival_times, random_requests

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(slots=True)
class RequestFuncOutput:
    """What the client saw of one request (vLLM's name). Times in seconds."""

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    generated_text: str = ""
    error: str = ""


def _chunk_text(choice: dict) -> str:
    delta = choice.get("delta")  # a chat chunk carries its text in delta.content
    return (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""


async def async_request_openai_completions(client, api_url: str, payload: dict,
                                           prompt_len: int) -> RequestFuncOutput:
    """POST one streaming completion and time its chunks as they come off the socket."""
    out = RequestFuncOutput(prompt_len=prompt_len)
    chunks, usage_tokens, last = 0, None, 0.0
    st = time.perf_counter()
    try:
        async with client.stream("POST", api_url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                out.error = f"HTTP {resp.status_code}: {body[:300]}"
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, comments, keep-alives
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                msg = json.loads(data)
                if msg.get("error"):
                    out.error = str(msg["error"])[:300]
                    return out
                if msg.get("usage"):
                    usage_tokens = msg["usage"].get("completion_tokens")
                    out.prompt_len = msg["usage"].get("prompt_tokens") or prompt_len
                choices = msg.get("choices") or []
                text = _chunk_text(choices[0]) if choices else ""
                if not text:
                    continue  # a role, finish_reason or usage-only chunk: no token arrived
                if chunks == 0:
                    out.ttft = now - st
                else:
                    out.itl.append(now - last)
                last = now
                chunks += 1
                out.generated_text += text
        out.latency = time.perf_counter() - st
    except Exception as e:  # a benchmark counts a broken request and carries on
        out.error = f"{type(e).__name__}: {e}"
        return out
    out.output_tokens = usage_tokens if usage_tokens is not None else chunks
    if chunks == 0:
        out.error = "the stream carried no content"
        return out
    out.success = True
    return out


def _stats(name: str, values: list[float]) -> dict:
    """mean, std, median and p99 of ``values`` seconds, as vLLM's ``*_ms`` keys (0 when empty)."""
    ms = np.asarray(values, dtype=float) * 1000 if values else np.zeros(1)
    return {f"mean_{name}_ms": float(np.mean(ms)), f"std_{name}_ms": float(np.std(ms)),
            f"median_{name}_ms": float(np.median(ms)),
            f"p99_{name}_ms": float(np.percentile(ms, 99))}


def calculate_metrics(outputs: list[RequestFuncOutput], duration_s: float) -> dict:
    """vLLM's metrics over one rate's requests; failed requests count only in ``failed``."""
    ok = [o for o in outputs if o.success]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    series = {
        "ttft": [o.ttft for o in ok],
        "tpot": [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1],
        "itl": [gap for o in ok for gap in o.itl],
        "e2el": [o.latency for o in ok],
    }
    m = {
        "completed": len(ok), "failed": len(outputs) - len(ok), "duration_s": duration_s,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
    }
    for name in METRICS:
        m |= _stats(name, series[name])
    errors = collections.Counter(o.error for o in outputs if not o.success)
    m["errors"] = dict(errors.most_common(5))  # why requests failed, the five commonest
    return m


async def _run_rate(client, api_url: str, model: str | None, reqs: list[SampleRequest],
                    rate: float, burstiness: float, max_concurrency: int | None, seed: int,
                    max_duration_s: float, on_done=None) -> tuple[list[RequestFuncOutput], float]:
    """Send ``reqs`` on the arrival schedule; give up on whatever is unfinished at the deadline."""
    offsets = arrival_times(len(reqs), rate, burstiness, seed)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def one(offset: float, r: SampleRequest) -> RequestFuncOutput:
        await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
        payload = {"prompt": r.prompt, "max_tokens": r.expected_output_len, "temperature": 0.0,
                   "stream": True, "ignore_eos": True,
                   "stream_options": {"include_usage": True}}
        if model is not None:
            payload["model"] = model
        async with sem:  # waiting here is not timed: the request is not sent yet
            out = await async_request_openai_completions(client, api_url, payload, r.prompt_len)
        if on_done is not None:
            on_done()
        return out

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(one(off, r)) for off, r in zip(offsets, reqs, strict=True)]
    done, pending = await asyncio.wait(tasks, timeout=max_duration_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    duration = time.perf_counter() - t0
    late = f"unfinished after max_duration_s={max_duration_s}"
    return [t.result() if t in done else RequestFuncOutput(error=late) for t in tasks], duration


def _served_model(base_url: str, timeout: float) -> str | None:
    """The first id that ``/v1/models`` lists, or None (and the field is left out)."""
    import httpx

    try:
        r = httpx.get(f"{base_url}/v1/models", timeout=timeout, trust_env=False)
        return r.json()["data"][0]["id"] if r.status_code == 200 else None
    except Exception:
        return None


def _vocab_size(model) -> int:
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def _rate_value(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate


async def _arun_bench(base_url: str, rates: list[float], reqs: list[SampleRequest],
                      model_name: str | None, burstiness: float, max_concurrency: int | None,
                      seed: int, request_timeout_s: float, max_duration_s: float,
                      progress: bool) -> list[dict]:
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    api_url = f"{base_url}/v1/completions"
    limits = httpx.Limits(max_connections=len(reqs) + 1, max_keepalive_connections=len(reqs))
    results = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s), limits=limits,
                                 trust_env=False) as client:
        # One request first, as vLLM does: a wrong URL or a refused payload fails here, loudly,
        # not as N failed requests; it also warms the server before anything is timed.
        first = reqs[0]
        probe = await async_request_openai_completions(client, api_url, {
            "prompt": first.prompt, "max_tokens": min(first.expected_output_len, 4),
            "temperature": 0.0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            **({"model": model_name} if model_name is not None else {})}, first.prompt_len)
        if not probe.success:
            raise RuntimeError(f"the test request to {api_url} failed: {probe.error}")
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True), disable=not progress) as bar:
            for rate in rates:
                task = bar.add_task(f"rate {_rate_value(rate)}", total=len(reqs))
                outs, duration = await _run_rate(
                    client, api_url, model_name, reqs, rate, burstiness, max_concurrency, seed,
                    max_duration_s, on_done=lambda task=task: bar.advance(task))
                results.append({"rate": _rate_value(rate), "burstiness": burstiness,
                                "max_concurrency": max_concurrency,
                                **calculate_metrics(outs, duration)})
    return results


def run_bench(url: str | None = None, rates=(float("inf"),), requests: int = 64,
              input_len: int = 64, output_len: int = 32, range_ratio: float = 0.0,
              burstiness: float = 1.0, max_concurrency: int | None = None, seed: int = 0,
              model=None, served_model_name: str | None = None, vocab_size: int | None = None,
              prompt_format: str = "ids", dtype: str | None = None, device: str | None = None,
              max_num_seqs: int | None = None, request_timeout_s: float = 120.0,
              max_duration_s: float = 600.0, server_timeout_s: float = 180.0,
              progress: bool = False, engine_args: tuple[str, ...] = ()) -> list[dict]:
    """One dict of vLLM's serving metrics per rate, in ``rates`` order (times in ms).

    ``url`` is the server's base (``http://127.0.0.1:8000``); without it ``model`` (default: the
    shipped checkpoint) is served by a ``nanoserve serve`` subprocess for the run, with
    ``dtype``, ``device``, ``max_num_seqs`` and any more ``engine_args`` (its flags). The same
    seeded requests go out at every rate. ``model`` also gives the vocabulary for the prompts'
    token ids (or ``vocab_size``), and the tokenizer when ``prompt_format="text"``.
    """
    rates = [float(r) for r in rates]
    if not rates:
        raise ValueError("no rates given")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    if prompt_format not in ("ids", "text"):
        raise ValueError(f"prompt_format must be 'ids' or 'text', got {prompt_format!r}")
    model_dir = Path(model) if model is not None else DEFAULT_MODEL
    tokenizer = None
    if prompt_format == "text":
        from ..tokenizer import Tokenizer

        tokenizer = Tokenizer.from_dir(model_dir)
    reqs = random_requests(requests, input_len, output_len, range_ratio,
                           vocab_size or _vocab_size(model_dir), seed, tokenizer=tokenizer)
    if url is None:
        server = local_server(model_dir, dtype=dtype, device=device, max_num_seqs=max_num_seqs,
                              timeout_s=server_timeout_s, extra_args=tuple(engine_args))
    else:
        server = contextlib.nullcontext(LocalServer(url.rstrip("/"), None))
    with server as srv:
        base_url = srv.url
        name = served_model_name or _served_model(base_url, request_timeout_s)
        coro = _arun_bench(base_url, rates, reqs, name, burstiness, max_concurrency, seed,
                           request_timeout_s, max_duration_s, progress)
        results = run_sync(coro)  # a notebook's running loop is not ours to block
    workload = {"model": name or (str(model) if model is not None else DEFAULT_MODEL.name),
                "requests": requests, "input_len": input_len, "output_len": output_len,
                "range_ratio": range_ratio, "seed": seed}
    return [r | workload for r in results]


ROWS = [  # (label, key, format) of the table, in vLLM's order
    ("Successful requests", "completed", "{:d}"),
    ("Failed requests", "failed", "{:d}"),
    ("Benchmark duration (s)", "duration_s", "{:.2f}"),
    ("Total input tokens", "total_input_tokens", "{:d}"),
    ("Total generated tokens", "total_output_tokens", "{:d}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.2f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.2f}"),
] + [(f"{stat.capitalize()} {name.upper()} (ms)", f"{stat}_{name}_ms", "{:.2f}")
     for name in METRICS for stat in ("mean", "median", "p99")]


def rounded(results: list[dict], ndigits: int = 2) -> list[dict]:
    """The results as the table shows them: floats to ``ndigits`` places."""
    return [{k: round(v, ndigits) if isinstance(v, float) and math.isfinite(v) else v
             for k, v in r.items()} for r in results]


def print_table(results: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    for r in results:
        table.add_column(f"rate {r['rate']}", justify="right")
    for label, key, fmt in ROWS:
        table.add_row(label, *(fmt.format(r[key]) for r in results))
    Console(stderr=True).print(table)


def _rates(text: str) -> list[float]:
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
    from ..config import EngineConfig

    p.add_argument("--url", default=None,
                   help="server base URL; without it --model is served on 127.0.0.1 with the "
                        "engine options below")
    p.add_argument("--served-model-name", default=None,
                   help="the request's model field (default: the first of /v1/models)")
    p.add_argument("--rates", type=_rates, default=[1.0, 2.0, 4.0, math.inf],
                   help="comma-separated request rates per second; inf sends all at once")
    p.add_argument("--requests", type=int, default=64, help="requests per rate")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]")
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
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    EngineConfig.add_cli_args(p)


def main(args: argparse.Namespace) -> int:
    try:
        results = run_bench(
            args.url, args.rates, args.requests, args.input_len, args.output_len,
            args.range_ratio, args.burstiness, args.max_concurrency, args.seed, args.model,
            args.served_model_name, args.vocab_size, args.prompt_format,
            request_timeout_s=args.request_timeout, max_duration_s=args.max_duration,
            server_timeout_s=args.server_timeout, progress=not args.no_progress,
            engine_args=tuple(engine_argv(engine_options_set(args))))
    except (ValueError, RuntimeError) as e:
        print(f"nanoserve bench serve: error: {e}", file=sys.stderr)
        return 2
    results = rounded(results)
    r0 = results[0]
    where = args.url or (f"a local nanoserve serve (device {args.device}, "
                         f"max_num_seqs {args.max_num_seqs}, {os.cpu_count()} host cores)")
    print_table(results, f"nanoserve bench serve: {r0['model']} on {where}; {args.requests} "
                         f"requests of {args.input_len} in/{args.output_len} out per rate, "
                         f"range_ratio {args.range_ratio}, burstiness {args.burstiness}, "
                         f"max_concurrency {args.max_concurrency}, seed {args.seed}")
    for r in results:
        for error, count in r["errors"].items():
            print(f"rate {r['rate']}: {count} failed: {error}", file=sys.stderr)
    if args.json:
        print(json.dumps(results))
    return 0 if all(r["failed"] == 0 for r in results) else 1
