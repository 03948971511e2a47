"""vLLM's side of ``nanoserve bench spec``: its CPU build with the same ``speculative_config``.

Why this module exists: issue 41 asks for nanoserve's speculative decode speed as a ratio over
vLLM's, on the same checkpoint, prompts and configuration, with both engines' acceptance beside
it (a faster engine that accepts fewer proposals is a different finding from one that verifies
faster). vLLM runs in its own venv through ``vllm_engine.VllmEngine`` (``vllm_runner.py`` on the
other end), given ``speculative_config`` and ``disable_log_stats=False`` as ``vllm.LLM``
options, one request at a time (``max_num_seqs=1``, one ``generate`` per prompt).

Its figures come from vLLM's own metrics (``LLM.get_metrics()``), read before and after each
request: ``vllm:request_decode_time_seconds`` (first token to last, vLLM's decode phase) gives
decode tokens/s as nanoserve's arm computes it (output tokens after the first over that time);
``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens`` and ``..._num_accepted_tokens`` give
the mean acceptance length (1 + accepted / drafts) and the acceptance rate. End-to-end time is
vLLM's ``generate`` call as the runner measures it. Without the venv the arm is a row saying so.
"""

from __future__ import annotations

from pathlib import Path

from nanoserve.bench.adapters import Setup, Skipped
from nanoserve.bench.spec_workload import SpecWorkload
from nanoserve.bench.workload import Workload

DECODE = "vllm:request_decode_time_seconds"
SPEC = {"num_drafts": "vllm:spec_decode_num_drafts",
        "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
        "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}


def _one(prompt: list[int], max_tokens: int) -> Workload:
    return Workload([prompt], [max_tokens], 0, (len(prompt), len(prompt)),
                    (max_tokens, max_tokens))


def _delta(after: dict, before: dict, key: str) -> float:
    return float(after.get(key, 0)) - float(before.get(key, 0))


def vllm_spec_arm(name: str, venv: Path, model: Path, dtype: str, spec: dict | None,
                  wl: SpecWorkload, rounds: int, max_model_len: int, log) -> dict:
    """One vLLM process (``spec`` or none), ``wl``'s requests one at a time for ``rounds``
    rounds after a warm-up; one row: each round's figures and the outputs of the last."""
    from nanoserve.bench.vllm_engine import VllmEngine

    row = {"arm": name, "engine": "vllm", "spec": spec, "status": "ok", "rounds": []}
    options = {"disable_log_stats": False}
    if spec is not None:
        options["speculative_config"] = spec
    try:
        eng = VllmEngine(Setup(model=Path(model), dtype=dtype, device="cpu", batch=1,
                               max_model_len=max_model_len, vllm_venv=Path(venv),
                               vllm_options=options, vllm_timeout_s=900))
    except Skipped as e:
        return {**row, "status": "skipped", "reason": str(e)}
    except Exception as e:
        return {**row, "status": "error", "reason": f"{type(e).__name__}: {e}"[:800]}
    try:
        row.update(version=eng.version, threads=eng.threads, notes=eng.notes)
        eng.run(_one(wl.prompts[0], min(8, wl.max_tokens)))  # warm-up, untimed
        for r in range(rounds):
            log(f"vLLM {name}, round {r + 1}/{rounds}")
            before = eng.metrics()
            outs, e2e = [], 0.0
            for p in wl.prompts:
                outs += eng.run(_one(p, wl.max_tokens))
                e2e += eng.last_wall_s
            after = eng.metrics()
            got = _figures(before, after, outs, e2e)
            row["rounds"].append(got)
            row.update({k: got[k] for k in (*SPEC, "mean_acceptance_length",
                                            "acceptance_rate")}, outputs=outs)
    except Exception as e:
        row.update(status="error", reason=f"{type(e).__name__}: {e}"[:800])
    finally:
        eng.close()
    return row


def _figures(before: dict, after: dict, outs: list[list[int]], e2e_s: float) -> dict:
    tokens = sum(len(o) for o in outs)
    decode_s = _delta(after, before, f"{DECODE}:sum")
    got = {k: int(_delta(after, before, v)) for k, v in SPEC.items()}
    drafts, proposed, accepted = (got["num_drafts"], got["num_draft_tokens"],
                                  got["num_accepted_tokens"])
    return {"e2e_s": e2e_s, "output_tokens": tokens, "e2e_tokens_per_s": tokens / e2e_s,
            "decode_s": decode_s if f"{DECODE}:sum" in after else None,
            "decode_tokens_per_s": (tokens - len(outs)) / decode_s if decode_s > 0 else None,
            **got,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "acceptance_rate": accepted / proposed if proposed else None}
