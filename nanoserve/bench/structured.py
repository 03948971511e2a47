"""``nanoserve bench structured``: what a grammar costs a decode step, and what its cache saves.

Why this module exists: structured outputs add work to every step of a constrained row (the
grammar's matcher walks the vocabulary to fill the row's bitmask, the sampler unpacks it and
masks the logits, the matcher advances by the sampled token) and work to every new request (its
grammar compiled). Whether that matters is a measurement, as a ratio against the same batch
without grammars, in the same run:

- ``overhead``: ``rows`` requests decoded together, ``constrained`` of them under a JSON schema
  that cannot close within ``tokens`` tokens, against the same prompts with no grammar; both
  arms generate exactly ``rows x tokens`` tokens, in interleaved rounds, best round each. The
  constrained arm's sampler is timed from inside, split into the mask's fill (the library) and
  its application (torch);
- ``compile``: each of 50 seeded random schemas compiled cold (``GrammarBackend.compile``)
  against a request's matcher from the cache (``matcher``, a copy of the compiled template),
  each followed by its first mask;
- ``vocab``: the fill of one row's mask on byte-level vocabularies of growing size (a synthetic
  vocabulary, since no real 128k tokenizer ships here), with the view's build time;
- ``apply``: the masks applied to a batch's logits at those sizes, PyTorch's unpack against
  the C++ op.

    nanoserve bench structured --rows 8 --constrained 4 --tokens 64 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time

from nanoserve.bench.hardware import hardware
from nanoserve.config import DEFAULT_MODEL

# An array of objects that needs 50 items: no completion closes it in the tokens a round has.
LONG_SCHEMA = {"type": "array", "minItems": 50, "items": {
    "type": "object", "required": ["name", "age"], "additionalProperties": False,
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120}}}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--constrained", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vocab-sizes", default="2048,32768,131072")
    p.add_argument("--json", action="store_true")


class SamplerClock:
    """Times ``structured.mask.fill`` and ``apply_words`` as the sampler calls them (a patch of
    the names ``sampling`` looks up: it fills the masks, then applies the filled words),
    counting the steps that had a constrained row."""

    def __init__(self):
        self.fill_s = self.apply_s = 0.0
        self.steps = 0

    def __enter__(self):
        from nanoserve.structured import mask

        self.mask, self.real_fill, self.real_apply = mask, mask.fill, mask.apply_words
        clock = self

        def fill(matchers, vocab_size):
            t0 = time.perf_counter()
            try:
                return clock.real_fill(matchers, vocab_size)
            finally:
                clock.fill_s += time.perf_counter() - t0

        def apply_words(logits, rows, words):
            clock.steps += bool(rows)
            t0 = time.perf_counter()
            try:
                return clock.real_apply(logits, rows, words)
            finally:
                clock.apply_s += time.perf_counter() - t0

        mask.fill, mask.apply_words = fill, apply_words
        return self

    def __exit__(self, *exc):
        self.mask.fill, self.mask.apply_words = self.real_fill, self.real_apply


def overhead(llm, rows: int = 8, constrained: int = 4, tokens: int = 64, rounds: int = 3) -> dict:
    """Decode time of ``rows`` rows with ``constrained`` under LONG_SCHEMA, against none."""
    from nanoserve.sampling.params import SamplingParams
    from nanoserve.structured.params import StructuredOutputsParams

    prompts = [f"Record {i} as JSON:" for i in range(rows)]
    free = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    spec = StructuredOutputsParams(json=LONG_SCHEMA)
    arms = {"none": [free] * rows,
            "half": [SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True,
                                    structured_outputs=spec)] * constrained
            + [free] * (rows - constrained)}
    best: dict[str, float] = {}
    split = {}
    outs = {}
    for arm in arms:  # warm-up: the grammar compiled, the engine's first steps taken
        outs[arm] = llm.generate(prompts, arms[arm])
    for i in range(rounds):
        for arm in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
            with SamplerClock() as clock:
                t0 = time.perf_counter()
                got = llm.generate(prompts, arms[arm])
                wall = time.perf_counter() - t0
            n = sum(len(o.token_ids) for o in got)
            if n != rows * tokens:
                raise RuntimeError(f"arm {arm}: {n} tokens, expected {rows * tokens}")
            if arm not in best or wall < best[arm]:
                best[arm] = wall
                if arm == "half":
                    steps = max(1, clock.steps)
                    split = {"fill_ms_per_step": 1e3 * clock.fill_s / steps,
                             "apply_ms_per_step": 1e3 * clock.apply_s / steps,
                             "masked_steps": clock.steps, "wall_s": wall}
    free_same = all(a.token_ids == b.token_ids for a, b in
                    zip(outs["none"][constrained:], outs["half"][constrained:], strict=True))
    step_ms = {arm: 1e3 * best[arm] / tokens for arm in best}
    return {"rows": rows, "constrained": constrained, "tokens": tokens, "rounds": rounds,
            "ms_per_step": step_ms, "ratio": best["half"] / best["none"],
            "mask_share": (split["fill_ms_per_step"] + split["apply_ms_per_step"])
            / step_ms["half"], **split, "free_rows_unchanged": free_same,
            "constrained_text": outs["half"][0].text[:80]}


def compile_costs(backend, n: int = 50) -> dict:
    """Median milliseconds for a cold compile and for a cached copy, each with its first mask,
    over ``n`` seeded random schemas (``nanoserve.testing.random_json_schema``)."""
    from nanoserve.structured.mask import fill
    from nanoserve.structured.params import StructuredOutputsParams
    from nanoserve.testing import random_json_schema

    specs = [StructuredOutputsParams(json=random_json_schema(random.Random(s)))
             for s in range(n)]
    cold, cached = [], []
    for spec in specs:
        t0 = time.perf_counter()
        m = backend.compile(spec)
        fill([m], backend.vocab_size)
        cold.append(time.perf_counter() - t0)
        backend.template(spec)  # into the cache
        t0 = time.perf_counter()
        m = backend.matcher(spec)
        fill([m], backend.vocab_size)
        cached.append(time.perf_counter() - t0)
    c, h = statistics.median(cold), statistics.median(cached)
    return {"schemas": n, "cold_ms": 1e3 * c, "cached_ms": 1e3 * h, "saved": c / h,
            "cold_max_ms": 1e3 * max(cold)}


def synthetic_vocabulary(size: int, seed: int = 0) -> tuple[str, int]:
    """A byte-level BPE ``tokenizer.json`` with ``size`` ids (the 256 byte symbols, the shipped
    model's tokens, then random pairs of them up to 16 characters, and one EOS), and the EOS id.
    Its merges are empty: llguidance reads the vocabulary, not how text is split."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    base = list(json.loads((DEFAULT_MODEL / "tokenizer.json").read_text())["model"]["vocab"])
    vocab = {a: i for i, a in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for w in base:
        if len(vocab) >= size - 1:
            break
        vocab.setdefault(w, len(vocab))
    rng = random.Random(seed)
    while len(vocab) < size - 1:
        w = rng.choice(base) + rng.choice(base)
        if len(w) <= 16:
            vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|synthetic_eos|>"])
    return tok.to_str(), tok.token_to_id("<|synthetic_eos|>")


def vocab_costs(sizes: list[int], steps: int = 40) -> list[dict]:
    """Per vocabulary size: the view's build time and the median fill of one row's mask over
    ``steps`` tokens of LONG_SCHEMA, each token drawn (seeded) from the allowed set."""
    import torch

    from nanoserve.structured.backend import GrammarBackend
    from nanoserve.structured.mask import allowed, fill
    from nanoserve.structured.params import StructuredOutputsParams

    out = []
    for size in sizes:
        text, eos = synthetic_vocabulary(size)
        t0 = time.perf_counter()
        backend = GrammarBackend(text, size, [eos])
        view_s = time.perf_counter() - t0
        m = backend.matcher(StructuredOutputsParams(json=LONG_SCHEMA))
        rng, times = random.Random(0), []
        for _ in range(steps):
            t0 = time.perf_counter()
            words = fill([m], size)
            times.append(time.perf_counter() - t0)
            ok = torch.nonzero(allowed(words, size)[0]).flatten().tolist()
            m.consume_token(ok[rng.randrange(len(ok))])
        out.append({"vocab": size, "view_s": view_s,
                    "fill_ms": 1e3 * statistics.median(times)})
    return out


def apply_costs(sizes: list[int], batch: int = 8, constrained: int = 4,
                repeats: int = 50) -> list[dict]:
    """Per vocabulary size: microseconds to apply ``constrained`` rows' masks to a (batch, V)
    float32 logits tensor, the PyTorch unpack against the C++ op (when loaded), interleaved.
    The words are seeded and sparse (one word in twenty allows anything), as a JSON state's
    mask mostly is; the logits' copy is in both."""
    import torch

    from nanoserve.cpu import csrc
    from nanoserve.structured import mask

    have_op = csrc.load() is None
    out = []
    g = torch.Generator().manual_seed(0)
    rows = list(range(0, batch, max(1, batch // constrained)))[:constrained]
    for size in sizes:
        W = -(-size // 32)
        words = torch.randint(-(2**31), 2**31 - 1, (len(rows), W), generator=g,
                              dtype=torch.int64).to(torch.int32)
        words[torch.rand(len(rows), W, generator=g) >= 0.05] = 0
        logits = torch.randn(batch, size, generator=g)
        arms = {"torch": functools.partial(_torch_apply, logits, rows, words, mask)}
        if have_op:
            arms["op"] = functools.partial(_op_apply, logits, rows, words)
        best = {k: float("inf") for k in arms}
        for _ in range(repeats):
            for k, fn in arms.items():
                t0 = time.perf_counter()
                fn()
                best[k] = min(best[k], time.perf_counter() - t0)
        row = {"vocab": size, **{f"{k}_us": 1e6 * v for k, v in best.items()}}
        if have_op:
            row["op_speedup"] = best["torch"] / best["op"]
        out.append(row)
    return out


def _torch_apply(logits, rows, words, mask):
    ok = mask.allowed(words, logits.shape[1])
    out = logits.clone()
    out[rows] = out[rows].masked_fill(~ok, float("-inf"))
    return out


def _op_apply(logits, rows, words):
    import torch

    out = logits.clone()
    torch.ops.nanoserve.apply_token_bitmask(out, torch.tensor(rows), words)
    return out


def run(model, dtype: str, rows: int, constrained: int, tokens: int, rounds: int,
        sizes: list[int]) -> dict:
    from nanoserve.llm import LLM

    llm = LLM(model, dtype=dtype, max_num_seqs=rows)
    return {"hardware": hardware("cpu"), "model": str(model), "dtype": dtype,
            "overhead": overhead(llm, rows, constrained, tokens, rounds),
            "compile": compile_costs(llm.core.grammars()),
            "vocab": vocab_costs(sizes), "apply": apply_costs(sizes, rows, constrained)}


def main(args: argparse.Namespace) -> int:
    if not 0 < args.constrained <= args.rows:
        print("nanoserve bench structured: error: --constrained must be in 1..--rows",
              file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.vocab_sizes.split(",") if s]
    report = run(args.model, args.dtype, args.rows, args.constrained, args.tokens, args.rounds,
                 sizes)
    o, c = report["overhead"], report["compile"]
    hw = report["hardware"]
    print(f"{hw['cpu']}, {hw['cores']} cores, torch {hw['torch']}, {args.dtype}, "
          f"{args.model}", file=sys.stderr)
    print(f"  decode, {o['rows']} rows x {o['tokens']} tokens, {o['constrained']} constrained: "
          f"{o['ms_per_step']['half']:.2f} ms a step against {o['ms_per_step']['none']:.2f} "
          f"unconstrained ({o['ratio']:.2f}x); mask fill {o['fill_ms_per_step']:.3f} ms + "
          f"apply {o['apply_ms_per_step']:.3f} ms a step ({o['mask_share']:.0%})",
          file=sys.stderr)
    print(f"  compile, {c['schemas']} schemas: cold {c['cold_ms']:.2f} ms, cached "
          f"{c['cached_ms']:.3f} ms (median, first mask included): {c['saved']:.0f}x",
          file=sys.stderr)
    for v in report["vocab"]:
        print(f"  vocabulary {v['vocab']:>7,}: view {v['view_s']:.2f} s, one row's fill "
              f"{v['fill_ms']:.3f} ms", file=sys.stderr)
    for a in report["apply"]:
        op = f", C++ op {a['op_us']:.0f} us ({a['op_speedup']:.1f}x)" if "op_us" in a else ""
        print(f"  apply, vocabulary {a['vocab']:>7,}: PyTorch {a['torch_us']:.0f} us{op}",
              file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0
