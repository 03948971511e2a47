"""The serving benchmark: a seeded workload sent over HTTP at a chosen rate, timed by the client.

Why this module exists: an engine's own counters say how fast it steps; a user feels something
else, the time between sending a request and reading its tokens off a socket, with everybody
else's requests in the same batch. This is vLLM's ``benchmark_serving`` for nanoserve: it sends a
seeded workload (``workload.py``: ``--dataset-name random``, ``prefix_repetition`` or
``long_among_short``) to ``/v1/completions`` with ``stream: true`` and ``ignore_eos: true`` at
each request rate in turn (Poisson arrivals, or gamma with ``burstiness``, or all at once for
``inf``), optionally capped at ``max_concurrency`` requests in flight, and reports per rate,
under vLLM's key names, TTFT, ITL, TPOT, E2EL and throughput (``serve_metrics.py`` says what
each one is). A workload whose requests carry classes (``long_among_short``: ``long`` and
``short``) also gets the same metrics per class under ``groups``. Where the server's
``/metrics`` shows them, the prefix cache's queries and hits, its evicted blocks and the
preemptions during each rate are reported under ``server_counters`` (read before and after it).

Output tokens come from the ``usage`` in the final chunk (``stream_options.include_usage``);
a server that sends none is counted by its content chunks. Without ``--url`` the benchmark
starts ``nanoserve serve`` on a free port of 127.0.0.1, waits for ``/health``, and stops it
afterwards; the started server takes every engine flag of ``nanoserve serve``
(``EngineConfig.add_cli_args``: ``--model``, ``--dtype``, ``--max-num-seqs``,
``--enable-prefix-caching``, ...), and the benchmark passes on those set away from their
defaults, spelt as that parser spells them. The command line is ``serve_cli.py``.

    nanoserve bench serve --rates 1,4,inf --requests 64 --json
    nanoserve bench serve --url http://127.0.0.1:8000 --rates inf --max-concurrency 8
    nanoserve bench serve --dataset-name prefix_repetition --enable-prefix-caching --rates inf
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from pathlib import Path

from nanoserve.bench import run_sync
from nanoserve.bench.local_server import LocalServer, local_server
from nanoserve.bench.serve_metrics import (  # noqa: F401  (ROWS, METRICS: kept importable)
    METRICS,
    ROWS,
    RequestFuncOutput,
    calculate_metrics,
    print_table,
    rounded,
    server_counters,
)
from nanoserve.bench.workload import SampleRequest, arrival_times, sample_requests
from nanoserve.config import DEFAULT_MODEL


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


async def _counters(client, base_url: str) -> dict[str, int]:
    """The server's own counters from ``/metrics`` (``{}`` if it shows none, or no page)."""
    try:
        r = await client.get(f"{base_url}/metrics")
        return server_counters(r.text) if r.status_code == 200 else {}
    except Exception:  # a server without /metrics is still benchmarked
        return {}


def _details(outs: list[RequestFuncOutput]) -> dict:
    """Each request as the client saw it, in workload order (vLLM's ``--save-detailed`` keys;
    times in seconds)."""
    return {"input_lens": [o.prompt_len for o in outs],
            "output_lens": [o.output_tokens for o in outs], "ttfts": [o.ttft for o in outs],
            "itls": [list(o.itl) for o in outs],
            "generated_texts": [o.generated_text for o in outs],
            "errors": [o.error for o in outs]}


def _groups(reqs: list[SampleRequest], outs: list[RequestFuncOutput], duration: float) -> dict:
    """The metrics of each class of request, when the workload has more than one."""
    labels = sorted({r.label for r in reqs})
    if len(labels) < 2:
        return {}
    return {label: {k: v for k, v in calculate_metrics(
        [o for r, o in zip(reqs, outs, strict=True) if r.label == label], duration).items()
        if k != "errors"} for label in labels}


async def _arun_bench(base_url: str, rates: list[float], reqs: list[SampleRequest],
                      model_name: str | None, burstiness: float, max_concurrency: int | None,
                      seed: int, request_timeout_s: float, max_duration_s: float,
                      progress: bool, detailed: bool = False) -> list[dict]:
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
                before = await _counters(client, base_url)
                outs, duration = await _run_rate(
                    client, api_url, model_name, reqs, rate, burstiness, max_concurrency, seed,
                    max_duration_s, on_done=lambda task=task: bar.advance(task))
                after = await _counters(client, base_url)
                results.append({"rate": _rate_value(rate), "burstiness": burstiness,
                                 "max_concurrency": max_concurrency,
                                 **calculate_metrics(outs, duration),
                                 "server_counters": {k: after[k] - before.get(k, 0)
                                                     for k in after},
                                 **({"groups": g} if (g := _groups(reqs, outs, duration))
                                    else {}),
                                 **({"details": _details(outs)} if detailed else {})})
    return results


def run_bench(url: str | None = None, rates=(float("inf"),), requests: int = 64,
              input_len: int = 64, output_len: int = 32, range_ratio: float = 0.0,
              burstiness: float = 1.0, max_concurrency: int | None = None, seed: int = 0,
              model=None, served_model_name: str | None = None, vocab_size: int | None = None,
              prompt_format: str = "ids", dtype: str | None = None, device: str | None = None,
              max_num_seqs: int | None = None, request_timeout_s: float = 120.0,
              max_duration_s: float = 600.0, server_timeout_s: float = 180.0,
              progress: bool = False, engine_args: tuple[str, ...] = (),
              dataset_name: str = "random", dataset_options: dict | None = None,
              detailed: bool = False) -> list[dict]:
    """One dict of vLLM's serving metrics per rate, in ``rates`` order (times in ms).

    ``url`` is the server's base (``http://127.0.0.1:8000``); without it ``model`` (default: the
    shipped checkpoint) is served by a ``nanoserve serve`` subprocess for the run, with
    ``dtype``, ``device``, ``max_num_seqs`` and any more ``engine_args`` (its flags). The same
    seeded requests go out at every rate. ``model`` also gives the vocabulary for the prompts'
    token ids (or ``vocab_size``), and the tokenizer when ``prompt_format="text"``.

    ``dataset_name`` picks the workload (``workload.DATASETS``); ``dataset_options`` are its own
    arguments (``workload.sample_requests``): ``prefix_repetition`` takes all of its lengths
    there, ``long_among_short`` its long requests' (``input_len`` and ``output_len`` are its
    short ones'), ``random`` none (it is ``input_len``, ``output_len`` and ``range_ratio``).
    ``detailed`` adds each request's lengths, times, text and error under ``details``.
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
        from nanoserve.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_dir(model_dir)
    options = dict(dataset_options or {})
    if dataset_name in ("random", "long_among_short"):
        options = dict(input_len=input_len, output_len=output_len) | options
    if dataset_name == "random":
        options["range_ratio"] = range_ratio
    reqs = sample_requests(dataset_name, requests, vocab_size or _vocab_size(model_dir), seed,
                           tokenizer=tokenizer, **options)
    if url is None:
        server = local_server(model_dir, dtype=dtype, device=device, max_num_seqs=max_num_seqs,
                              timeout_s=server_timeout_s, extra_args=tuple(engine_args))
    else:
        server = contextlib.nullcontext(LocalServer(url.rstrip("/"), None))
    with server as srv:
        base_url = srv.url
        name = served_model_name or _served_model(base_url, request_timeout_s)
        coro = _arun_bench(base_url, rates, reqs, name, burstiness, max_concurrency, seed,
                           request_timeout_s, max_duration_s, progress, detailed)
        results = run_sync(coro)  # a notebook's running loop is not ours to block
    workload = {"model": name or (str(model) if model is not None else DEFAULT_MODEL.name),
                "requests": requests, "input_len": input_len, "output_len": output_len,
                "range_ratio": range_ratio, "seed": seed, "dataset_name": dataset_name,
                "dataset_options": dict(dataset_options or {})}
    return [r | workload for r in results]
