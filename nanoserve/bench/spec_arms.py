"""The arms of ``nanoserve bench spec``: one engine with or without speculation, timed one way.

Why this module exists: a speed-up is a ratio of two arms, and it only means something if both
arms are timed the same way, on the same prompts, with the acceptance that produced it counted
from the same run. An arm (``SpecArm``) is one ``LLM`` (``speculative_config`` or none), pinned
to ``cpus`` (``threads_bind``: one torch thread a CPU), and ``run`` times a workload with it:

- ``batch=1``: the requests one after another, one ``generate`` each (one request in flight);
  decode seconds are the sum over requests of last token minus first token, end-to-end seconds
  the sum of each ``generate``'s wall time;
- ``batch=B``: ``B`` requests in one ``generate`` (concurrent, ``max_num_seqs >= B``); decode
  seconds run from the earliest first token to the latest last token, end-to-end seconds are
  the call's wall time (the batch's prompts fit one step's token budget, so every request
  has its first token from the same step and the decode time holds no prompt chunk).

Decode tokens/s is the output tokens after each request's first, summed, over decode seconds;
end-to-end tokens/s is every output token over end-to-end seconds (prefill included). The
speculative counters (``core.snapshot().spec_decode``) are read before and after, so each run
carries its own acceptance: mean acceptance length ``1 + accepted / drafts`` and acceptance
rate ``accepted / proposed``.

``step_costs`` times the two forwards speculation trades between on a warm engine: a plain
decode step (``Engine.decode``, one token a row) and a verify step (``Engine.score``, 1 + k
tokens a row, each position's logits), on rows granted by hand at a fixed context length and cut
back after every call, the calls interleaved, the median of many repetitions.
``truncated_draft`` writes a draft made of a checkpoint's first layers.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import torch

from nanoserve.bench.spec_workload import SpecWorkload
from nanoserve.llm import LLM
from nanoserve.sampling.params import SamplingParams


class SpecArm:
    """``LLM(model, dtype, speculative_config=spec)`` pinned to ``cpus``, greedy, EOS ignored."""

    def __init__(self, name: str, model: Path, dtype: str, spec: dict | None,
                 cpus: tuple[int, ...], max_num_seqs: int = 8, max_model_len: int = 512):
        self.name, self.spec, self.cpus = name, spec, tuple(cpus)
        torch.set_num_threads(len(cpus))
        options = {} if spec is None else {"speculative_config": spec}
        # a budget that holds every prompt of a batch: its prefill is one step, and its decode
        # time (earliest first token to latest last) holds no prompt chunk
        self.llm = LLM(model=str(model), dtype=dtype, skip_tokenizer_init=True,
                       max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                       max_num_batched_tokens=max_num_seqs * max_model_len,
                       threads_bind=",".join(map(str, cpus)), **options)
        self.proposer = (self.llm.core.proposer.describe() if self.llm.core.proposer is not None
                         else None)
        self.binding = self.llm.binding.describe()

    def _spec_counts(self) -> tuple[int, int, int, list[int]]:
        s = self.llm.core.snapshot().spec_decode
        if s is None:
            return 0, 0, 0, []
        return s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, list(s.accepted_per_pos)

    def run(self, wl: SpecWorkload, batch: int) -> dict:
        """Time ``wl`` at ``batch`` requests in flight (1: one after another); the figures of
        the module docstring, the outputs, and this run's speculative counters."""
        torch.set_num_threads(len(self.cpus))
        params = SamplingParams(temperature=0, max_tokens=wl.max_tokens, ignore_eos=True)
        before = self._spec_counts()
        outs, e2e_s, decode_s = [], 0.0, 0.0
        for i in range(0, len(wl.prompts), batch):
            t0 = time.perf_counter()
            got = self.llm.generate(wl.prompts[i:i + batch], params)
            e2e_s += time.perf_counter() - t0
            first = min(o.metrics.first_token_time for o in got)
            decode_s += max(o.metrics.last_token_time for o in got) - first
            outs += [list(o.token_ids) for o in got]
        after = self._spec_counts()
        drafts, proposed, accepted = (a - b for a, b in zip(after[:3], before[:3], strict=True))
        per_pos = [a - (before[3][i] if i < len(before[3]) else 0)
                   for i, a in enumerate(after[3])]
        out_tokens = sum(len(o) for o in outs)
        decode_tokens = out_tokens - len(outs)
        return {
            "decode_s": decode_s, "e2e_s": e2e_s, "output_tokens": out_tokens,
            "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else None,
            "e2e_tokens_per_s": out_tokens / e2e_s,
            "num_drafts": drafts, "num_draft_tokens": proposed, "num_accepted_tokens": accepted,
            "accepted_per_pos": per_pos,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "acceptance_rate": accepted / proposed if proposed else None,
            "outputs": outs}

    def close(self) -> None:
        self.llm.shutdown()
        self.llm = None


def step_costs(llm: LLM, ks: list[int], batch: int = 1, context: int = 192,
               reps: int = 50) -> dict:
    """A warm engine's plain decode step and verify steps of 1 + k tokens, for each ``k`` of
    ``ks``, ``batch`` rows at ``context`` tokens each: median milliseconds over ``reps`` calls,
    and each verify step's cost in plain steps (``ratio``)."""
    from nanoserve.cpu.threads import pinned

    engine = llm.engine
    rows = list(range(batch))
    vocab = llm.config.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(context)]
    with torch.inference_mode(), pinned(llm.binding):
        for r in rows:
            engine.grant(r, context + max(ks) + 1)
        try:
            engine.prefill(rows, [prompt] * batch)

            def cut():
                for r in rows:
                    engine.cache.truncate_row(r, context)

            calls = {0: lambda: engine.decode(rows, [5] * batch)}  # 0: the plain step
            calls.update({k: (lambda k=k: engine.score(rows, [[5] * (1 + k)] * batch,
                                                       [1 + k] * batch)) for k in ks})
            times: dict[int, list[float]] = {k: [] for k in calls}
            for rep in range(reps + 3):  # interleaved, so a load that drifts hits every kind
                for k, call in calls.items():
                    t0 = time.perf_counter()
                    call()
                    if rep >= 3:  # the first calls build what later ones reuse: untimed
                        times[k].append(time.perf_counter() - t0)
                    cut()
            ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
        finally:
            for r in rows:
                engine.release(r)
    return {"batch": batch, "context": context, "reps": reps, "decode_ms": round(ms[0], 4),
            "verify_ms": {k: round(ms[k], 4) for k in ks},
            "ratio": {k: round(ms[k] / ms[0], 3) for k in ks}}


def truncated_draft(src: Path, dst: Path, num_layers: int) -> tuple[Path, str]:
    """A draft of ``src``'s first ``num_layers`` layers at ``dst`` (made once), and who wrote
    it: ``nanoserve.spec_decode.draft.write_truncated_draft`` where it exists, else this
    module's own copy of the same recipe (embeddings, first layers, final norm, head)."""
    if (dst / "config.json").is_file():
        return dst, "written by an earlier run"
    try:
        from nanoserve.spec_decode.draft import write_truncated_draft
    except ImportError:
        write_truncated_draft = _write_truncated
        who = "written by bench.spec_arms: spec_decode.draft has no write_truncated_draft"
    else:
        who = "written by spec_decode.draft.write_truncated_draft"
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_truncated_draft(src, tmp, num_layers)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst, who


def _write_truncated(src: Path, dst: Path, num_layers: int) -> Path:
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"num_layers={num_layers}: {src} has {config['num_hidden_layers']}")
    keep = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, t in load_file(f).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= num_layers:
                continue
            keep[name] = t.contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    save_file(keep, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = num_layers
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    return dst


def predicted_speedup(a: float, k: int, c: float, verify: float = 1.0) -> float:
    """Leviathan et al.'s expected speed-up per verify step: ``(1 - a^(k+1)) / ((1 - a)(1 +
    k c))`` with ``a`` the acceptance rate, ``k`` proposals, ``c`` a draft step's cost in target
    steps (``a = 1``: ``(k + 1) / (1 + k c)``, the limit). ``verify``: the verify step's cost in
    plain target steps where it is not 1 (the formula's assumption), in place of the 1.

    >>> round(predicted_speedup(0.8, 4, 0.1), 3), predicted_speedup(1.0, 4, 0.0)
    (2.401, 5.0)
    >>> predicted_speedup(1.0, 4, 0.0, verify=2.5)
    2.0
    """
    if not 0 <= a <= 1 or k < 1 or c < 0 or verify <= 0:
        raise ValueError(f"a={a} must be in [0, 1], k={k} >= 1, c={c} >= 0, verify={verify} > 0")
    tokens = k + 1 if a == 1 else (1 - a ** (k + 1)) / (1 - a)
    return tokens / (verify + k * c)
