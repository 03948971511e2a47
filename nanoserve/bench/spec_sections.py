"""The sections of ``nanoserve bench spec``: which arms run on which workloads, in what order.

Why this module exists: every section of issue 41's benchmark is the same experiment with other
arms and workloads (a grid: arms x workloads x batch sizes, ``--rounds`` rounds, the arms'
order rotated each round so that no arm always runs after the same neighbour), plus what only
some sections need: the verify step's cost against a plain step on a random-weight model in a
published shape (``shape_section``), and a draft model's cost per step (``draft_section``). Each
function returns rows (dicts) that ``spec_report.summarize`` turns into figures; an arm that
cannot run is a row with ``status`` and ``reason``, never a number.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from nanoserve.bench.shapes import SHAPE_CACHE, shape_config
from nanoserve.bench.spec_arms import SpecArm, step_costs, truncated_draft
from nanoserve.bench.spec_workload import SpecWorkload, forced_repeat

RUN_KEYS = ("decode_tokens_per_s", "e2e_tokens_per_s", "decode_s", "e2e_s", "output_tokens")


def ngram_spec(k: int, lo: int, hi: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
            "prompt_lookup_max": hi}


def arm_name(spec: dict | None) -> str:
    if spec is None:
        return "off"
    if spec["method"] == "ngram":
        return (f"ngram k={spec['num_speculative_tokens']} "
                f"min={spec['prompt_lookup_min']} max={spec['prompt_lookup_max']}")
    return f"draft k={spec['num_speculative_tokens']} {Path(spec['model']).name}"


def cpus_for(threads: int) -> tuple[int, ...]:
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    if not 1 <= threads <= len(cpus):
        raise ValueError(f"threads={threads}: this process may use {len(cpus)} CPUs")
    return cpus[:threads]


def run_grid(section: str, model: Path, model_name: str, dtype: str, threads: int,
             specs: list[dict | None], jobs: list[tuple[SpecWorkload, int]], rounds: int,
             log, max_model_len: int = 512) -> list[dict]:
    """Every arm (``specs``: None is speculation off) on every (workload, batch) of ``jobs``,
    ``rounds`` interleaved rounds after a warm-up; one row per arm, workload and batch."""
    cpus = cpus_for(threads)
    rows: dict[tuple, dict] = {}
    arms: dict[str, SpecArm] = {}
    for spec in specs:
        name = arm_name(spec)
        base = {"section": section, "engine": "nanoserve", "model": model_name,
                "dtype": dtype, "threads": threads, "cpus": list(cpus), "arm": name,
                "spec": spec, "status": "ok"}
        for wl, batch in jobs:
            rows[name, wl.name, batch] = {**base, "workload": wl.name, "batch": batch,
                                          "rounds": []}
        try:
            log(f"{section}: loading {model_name} {dtype}, {name}, {threads} thread(s)")
            arms[name] = arm = SpecArm(name, model, dtype, spec, cpus,
                                       max(b for _, b in jobs), max_model_len)
            arm.run(jobs[0][0].head(1, 8), 1)  # warm-up, untimed
        except Exception as e:  # a proposer not built yet, say: the rows say why
            arms.pop(name, None)
            for wl, batch in jobs:
                rows[name, wl.name, batch].update(status="error",
                                                  reason=f"{type(e).__name__}: {e}"[:600])
            continue
        for wl, batch in jobs:
            rows[name, wl.name, batch].update(proposer=arm.proposer, binding=arm.binding)
    order = list(arms)
    for r in range(rounds):
        k = r % max(1, len(order))
        for wl, batch in jobs:
            for name in order[k:] + order[:k]:
                log(f"{section}: round {r + 1}/{rounds}, {wl.name}, batch {batch}, {name}")
                row = rows[name, wl.name, batch]
                try:
                    got = arms[name].run(wl, batch)
                except Exception as e:
                    row.update(status="error", reason=f"round {r + 1}: {type(e).__name__}: "
                                                      f"{e}"[:600])
                    continue
                row["outputs"] = got.pop("outputs")
                row["rounds"].append({k2: got[k2] for k2 in RUN_KEYS})
                row.update({k2: v for k2, v in got.items() if k2 not in RUN_KEYS})
                if wl.references is not None:  # the fewest leading tokens any request shares
                    row["reference_shared"] = min(_shared(o, ref) for o, ref in zip(
                        row["outputs"], wl.references, strict=True))
    for arm in arms.values():
        arm.close()
    return list(rows.values())


def _shared(a: list[int], b: list[int]) -> int:
    """How many leading tokens two outputs share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def shape_checkpoint_layers(shape: str, layers: int, seed: int = 0) -> Path:
    """Random weights in ``shape``'s published config with its first ``layers`` layers only
    (``shapes.shape_checkpoint``'s recipe: transformers writes the folder), made once under
    build/."""
    cfg = shape_config(shape)
    if not 1 <= layers <= cfg["num_hidden_layers"]:
        raise ValueError(f"layers={layers}: {shape} has {cfg['num_hidden_layers']}")
    out = SHAPE_CACHE / f"{shape}-L{layers}-seed{seed}"
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg["num_hidden_layers"] = layers
    dtype = getattr(torch, cfg.pop("torch_dtype", "float32") or "float32")
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg)).to(dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    model.save_pretrained(tmp)
    tmp.chmod(0o755)
    try:
        tmp.rename(out)
    except OSError:  # a concurrent run finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def shape_section(args, threads: int, specs: list[dict], log) -> dict:
    """The random-weight shape at one request: the forced-repeat workload (its references from
    the target with speculation off), off against each ngram arm, and the step costs."""
    model = shape_checkpoint_layers(args.shape, args.shape_layers, args.seed)
    name = f"{args.shape} L{args.shape_layers} random"
    cfg = json.loads((model / "config.json").read_text())
    cpus = cpus_for(threads)
    max_len = args.shape_prompt_len + args.shape_m + args.max_tokens + 16
    log(f"shape: {name}: references and step costs, {threads} thread(s)")
    ref = SpecArm("off", model, "bfloat16", None, cpus, 1, max_len)
    try:
        def greedy(prompts, n):
            wl = SpecWorkload("ref", prompts, n, "")
            return ref.run(wl, 1)["outputs"]

        wl = forced_repeat(greedy, args.shape_requests, args.shape_prompt_len,
                           cfg["vocab_size"], args.shape_m, args.max_tokens, args.seed)
        costs = step_costs(ref.llm, args.step_ks, 1, args.shape_prompt_len + args.shape_m,
                           args.step_reps)
    finally:
        ref.close()
    rows = run_grid("shape", model, name, "bfloat16", threads, [None, *specs], [(wl, 1)],
                    args.rounds, log, max_len)
    costs.update(model=name, dtype="bfloat16", threads=threads)
    return {"rows": rows, "step_costs": costs, "workload": wl.describe()}


def draft_section(args, threads: int, dtype: str, wl: SpecWorkload, target: Path,
                  log) -> dict:
    """The shipped model as target; drafts: its first ``--draft-layers`` layers, and itself.
    Each draft's step cost against the target's (``c``) from plain decode steps."""
    from nanoserve.spec_decode.proposer import proposer_class

    cpus = cpus_for(threads)
    drafts, notes = [], []
    for n in args.draft_layers:
        path, who = truncated_draft(target, SHAPE_CACHE.parent / "spec-drafts" /
                                    f"{target.name}-L{n}", n)
        drafts.append(path)
        notes.append(f"{path.name}: the target's first {n} layer(s) ({who})")
    drafts.append(target)
    notes.append(f"{target.name}: the target as its own draft")
    specs = [{"method": "draft_model", "num_speculative_tokens": args.k, "model": str(d)}
             for d in drafts]
    costs, verify = {}, None
    for d in [target, *drafts[:-1]]:
        arm = SpecArm("cost", d, dtype, None, cpus, 1, 512)
        try:
            got = step_costs(arm.llm, [args.k], 1, len(wl.prompts[0]), args.step_reps)
        finally:
            arm.close()
        costs[str(d)] = got["decode_ms"]
        verify = got["ratio"][args.k] if d == target else verify
    try:
        proposer_class("draft_model")
    except (ImportError, AttributeError) as e:
        reason = (f"the draft_model proposer is not built here ({type(e).__name__}: {e}); "
                  f"the arm is skipped")
        rows = [{"section": "draft", "engine": "nanoserve", "model": target.name,
                 "dtype": dtype, "threads": threads, "arm": arm_name(s), "spec": s,
                 "workload": wl.name, "batch": 1, "status": "skipped", "reason": reason,
                 "rounds": []} for s in [None, *specs]]
    else:
        rows = run_grid("draft", target, target.name, dtype, threads, [None, *specs],
                        [(wl, 1)], args.rounds, log)
    for r in rows:
        if r["spec"] is not None:
            r["draft_model"] = r["spec"]["model"]
            r["c"] = round(costs[r["draft_model"]] / costs[str(target)], 4)
            r["draft_step_ms"] = costs[r["draft_model"]]
            r["target_step_ms"] = costs[str(target)]
            r["verify_cost_in_steps"] = verify  # the target's 1 + k token step, in plain ones
    return {"rows": rows, "notes": notes, "step_ms": costs, "verify_cost_in_steps": verify}
