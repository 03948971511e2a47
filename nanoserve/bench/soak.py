"""The soak: thousands of requests, a fifth of them abandoned mid-flight, and nothing lost.

Why this module exists: leaks and stuck requests do not show in a unit test; they show after the
ten-thousandth request, when a block that one rare path forgot to free has become a hundred. The
soak starts one server on the shipped model, sends a seeded mix of requests from many concurrent
clients (completions and chat, streamed and not, random lengths and sampling parameters) and
hangs up on a share of them at random points: before the first byte, mid-stream, or while a
non-streamed answer is being computed. At the end it checks, from the outside:

- **leaked blocks**: ``kv_cache_usage_perc`` is exactly 0 on ``/metrics`` (the pool is full);
- **stuck requests**: running and waiting read 0 within 5 s of the last response;
- **mismatches**: every completed greedy request's text equals the offline engine's;
- **memory**: the server's RSS at the end is within 10% of its RSS after the first 1,000.

    nanoserve bench soak --requests 10000 --concurrency 64 --disconnect-rate 0.2 --seed 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from nanoserve.bench import run_sync
from nanoserve.llm import DEFAULT_MODEL


@dataclass(slots=True)
class Job:
    index: int
    chat: bool
    stream: bool
    prompt: str
    max_tokens: int
    params: dict
    hang_up_after: float | None  # seconds, or None: read to the end
    hang_up_chunks: int | None  # for streams: hang up after this many chunks
    greedy: bool = field(init=False)

    def __post_init__(self) -> None:
        self.greedy = self.params.get("temperature", 1.0) == 0


WORDS = ("the for statement while class tuple list import return yield lambda object "
         "function module error value string integer dictionary expression").split()


def make_jobs(n: int, seed: int, disconnect_rate: float, max_tokens: int = 24,
              chat: bool = True) -> list[Job]:
    """The seeded mix; ``chat=False``: completions only (a model without a chat template)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))).capitalize()
        greedy = rng.random() < 0.5
        params = {"temperature": 0} if greedy else {
            "temperature": round(rng.uniform(0.3, 1.5), 2), "top_p": round(rng.uniform(0.5, 1), 2),
            "top_k": rng.choice([0, 5, 50]), "seed": rng.randint(0, 10**6)}
        if not greedy and rng.random() < 0.3:
            params |= {"presence_penalty": 0.5, "repetition_penalty": 1.1}
        params["ignore_eos"] = rng.random() < 0.5
        stream = rng.random() < 0.5
        hang = rng.random() < disconnect_rate
        jobs.append(Job(i, chat and rng.random() < 0.3, stream, prompt, rng.randint(1, max_tokens),
                        params, rng.uniform(0.0, 0.3) if hang and not stream else None,
                        rng.randint(0, 4) if hang and stream else None))
    return jobs


def _body(job: Job, model: str) -> tuple[str, dict]:
    body = {"model": model, "max_tokens": job.max_tokens, "stream": job.stream, **job.params}
    if job.chat:
        return "/v1/chat/completions", body | {"messages": [{"role": "user",
                                                              "content": job.prompt}]}
    return "/v1/completions", body | {"prompt": job.prompt}


def _text(choice: dict, chat: bool, stream: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    part = choice.get("delta" if stream else "message") or {}
    return part.get("content") or ""


async def run_job(client, job: Job, model: str) -> dict:
    """One client's request. Returns what happened: completed, disconnected or failed."""
    path, body = _body(job, model)
    if job.hang_up_after is not None:  # a non-streamed request abandoned mid-computation
        task = asyncio.create_task(client.post(path, json=body))
        await asyncio.sleep(job.hang_up_after)
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            return {"outcome": "disconnected"}
        r = task.result()
        return _finished(job, r.status_code, r.json())
    if not job.stream:
        r = await client.post(path, json=body)
        return _finished(job, r.status_code, r.json())
    text, chunks = "", 0
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"outcome": "failed", "status": r.status_code}
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return {"outcome": "completed", "text": text}
            data = json.loads(line[6:])
            if "error" in data:
                return {"outcome": "failed", "status": 200, "error": data["error"]}
            for choice in data.get("choices", []):
                text += _text(choice, job.chat, True)
            chunks += 1
            if job.hang_up_chunks is not None and chunks > job.hang_up_chunks:
                return {"outcome": "disconnected"}  # leaving the block closes the socket
    return {"outcome": "failed", "status": 200, "error": "stream ended without [DONE]"}


def _finished(job: Job, status: int, data: dict) -> dict:
    if status != 200:
        return {"outcome": "failed", "status": status, "error": data.get("error")}
    return {"outcome": "completed", "text": _text(data["choices"][0], job.chat, False)}


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("nanoserve:") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _soak(base_url: str, pid: int, jobs: list[Job], concurrency: int, model: str,
                progress) -> dict:
    import httpx

    results: list[dict | None] = [None] * len(jobs)
    rss_at_1000 = None
    done = 0
    queue: asyncio.Queue[Job] = asyncio.Queue()
    for j in jobs:
        queue.put_nowait(j)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=120.0, limits=limits) as client:
        async def worker():
            nonlocal done, rss_at_1000
            while not queue.empty():
                job = queue.get_nowait()
                try:
                    results[job.index] = await run_job(client, job, model)
                except httpx.HTTPError as e:
                    results[job.index] = {"outcome": "failed", "error": repr(e)}
                done += 1
                if done == min(1000, len(jobs)) and rss_at_1000 is None:
                    rss_at_1000 = rss_bytes(pid)
                progress(done)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        last = time.monotonic()
        settled, metrics = None, {}
        while time.monotonic() - last < 5.0:
            metrics = _metrics((await client.get("/metrics")).text)
            if (metrics.get("nanoserve:num_requests_running", 1) == 0
                    and metrics.get("nanoserve:num_requests_waiting", 1) == 0
                    and metrics.get("nanoserve:kv_cache_usage_perc", 1) == 0):
                settled = round(time.monotonic() - last, 3)
                break
            await asyncio.sleep(0.05)
    return {"results": results, "rss_at_1000": rss_at_1000, "rss_end": rss_bytes(pid),
            "settled_s": settled, "metrics": metrics}


def reference_texts(jobs: list[Job], model_dir) -> dict[int, str]:
    """The offline engine's text for every greedy job, in float32 (what the server runs)."""
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    llm = LLM(model_dir, dtype="float32")
    greedy = [j for j in jobs if j.greedy]
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": j.prompt}],
                                                 tokenize=True) if j.chat else j.prompt
               for j in greedy]
    params = [SamplingParams(temperature=0, max_tokens=j.max_tokens,
                             ignore_eos=j.params["ignore_eos"]) for j in greedy]
    outs = llm.generate(prompts, params)
    return {j.index: o.text for j, o in zip(greedy, outs, strict=True)}


def run_soak(requests: int = 10_000, concurrency: int = 64, disconnect_rate: float = 0.2,
             seed: int = 0, model=None, max_num_seqs: int = 8, show_progress: bool = True,
             chat: bool | None = None) -> dict:
    """``chat``: mix in chat completions (None: where the model has a chat template)."""
    from rich.progress import Progress

    from nanoserve.bench.local_server import local_server
    from nanoserve.tokenizer import Tokenizer

    model_dir = Path(model) if model else DEFAULT_MODEL
    if chat is None:
        chat = Tokenizer.from_dir(model_dir).chat_template is not None
    jobs = make_jobs(requests, seed, disconnect_rate, chat=chat)
    t0 = time.perf_counter()
    with local_server(model_dir, dtype="float32", max_num_seqs=max_num_seqs,
                      timeout_s=180.0) as server, \
            Progress(transient=False, disable=not show_progress) as bar:
        task = bar.add_task("soak", total=len(jobs))
        raw = run_sync(_soak(server.url, server.pid, jobs, concurrency, model_dir.name,
                             lambda n: bar.update(task, completed=n)))
    wall = time.perf_counter() - t0
    reference = reference_texts(jobs, model_dir)
    outcomes = [r["outcome"] for r in raw["results"]]
    mismatched = [j.index for j, r in zip(jobs, raw["results"], strict=True)
                  if j.greedy and r["outcome"] == "completed" and r["text"] != reference[j.index]]
    m = raw["metrics"]
    growth = raw["rss_end"] / raw["rss_at_1000"] - 1
    return {
        "requests": requests, "concurrency": concurrency, "disconnect_rate": disconnect_rate,
        "seed": seed, "model": model_dir.name, "dtype": "float32", "max_num_seqs": max_num_seqs,
        "completed": outcomes.count("completed"), "disconnected": outcomes.count("disconnected"),
        "failed": outcomes.count("failed"),
        "failures": [r for r in raw["results"] if r["outcome"] == "failed"][:10],
        "streamed": sum(j.stream for j in jobs), "chat": sum(j.chat for j in jobs),
        "greedy_completed": sum(j.greedy and r["outcome"] == "completed"
                                for j, r in zip(jobs, raw["results"], strict=True)),
        "mismatches": len(mismatched), "mismatched_jobs": mismatched[:20],
        "leaked_blocks_frac": m.get("nanoserve:kv_cache_usage_perc"),
        "running_at_end": m.get("nanoserve:num_requests_running"),
        "waiting_at_end": m.get("nanoserve:num_requests_waiting"),
        "stuck_requests": 0 if raw["settled_s"] is not None else
        int(m.get("nanoserve:num_requests_running", 0) + m.get("nanoserve:num_requests_waiting",
                                                                0)),
        "settled_within_s": raw["settled_s"],
        "rss_after_1000_mb": round(raw["rss_at_1000"] / 2**20, 1),
        "rss_end_mb": round(raw["rss_end"] / 2**20, 1), "rss_growth": round(growth, 4),
        "wall_s": round(wall, 1),
    }


def verdict(s: dict) -> list[str]:
    """What did not hold; empty when the soak passed."""
    bad = []
    if s["failed"]:
        bad.append(f"{s['failed']} requests failed")
    if s["mismatches"]:
        bad.append(f"{s['mismatches']} greedy texts differ from the offline engine's")
    if s["stuck_requests"] or s["settled_within_s"] is None:
        bad.append("requests still running or waiting 5 s after the last response")
    if s["leaked_blocks_frac"] != 0:
        bad.append(f"KV usage {s['leaked_blocks_frac']} at the end: blocks leaked")
    if abs(s["rss_growth"]) > 0.10:
        bad.append(f"RSS grew {s['rss_growth']:.1%} after the first 1,000 requests")
    return bad


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--disconnect-rate", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="mix in chat completions (default: where the model has a chat "
                        "template; --no-chat: completions only, Day 48's recorded mix)")
    p.add_argument("--out", default=None, help="write the figures here as JSON")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    s = run_soak(args.requests, args.concurrency, args.disconnect_rate, args.seed, args.model,
                 args.max_num_seqs, chat=args.chat)
    table = Table(title=f"soak: {s['requests']} requests, {s['concurrency']} clients, "
                        f"{s['model']} {s['dtype']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in s.items():
        if key not in ("failures", "mismatched_jobs"):
            table.add_row(key, str(value))
    Console(stderr=True).print(table)
    problems = verdict(s)
    if args.out:
        record = {"values": s, "machine": _machine(), "python": platform.python_version(),
                      "date": time.strftime("%Y-%m-%d"),
                      "command": "nanoserve bench soak " + " ".join(sys.argv[3:]),
                      "passed": not problems, "problems": problems}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    for p in problems:
        print(f"soak: {p}", file=sys.stderr)
    return 1 if problems else 0


def _machine() -> str:
    """The CPU by name, its core count, and the GPU (none: the soak runs the server on CPU)."""
    import os

    from nanoserve.bench.hardware import cpu_model

    return f"{platform.machine()} {cpu_model()}, {os.cpu_count() or 1} CPUs, no GPU"
