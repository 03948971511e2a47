"""``nanoserve bench spec``'s figures: best rounds, ratios over speculation off, the targets,
the predictions, and the tables.

Why this module exists: issue 41's targets are ratios, and each must be computed one way and
printed beside what explains it (the mean acceptance length, the verify step's cost, the draft's
cost). Per row (an arm on a workload at a batch size and thread count): decode and end-to-end
tokens/s (the best round; every round listed), the ratio of each over the ``off`` row of the
same section, model, dtype, workload, batch and threads, whether the outputs are the off row's
token for token, and the target it answers to:

- copy-heavy: ngram >= 2x off at one request, >= 1.3x at 8 requests (decode tokens/s);
- no-repeat: ngram >= 0.95x off;
- vLLM: nanoserve's speculative decode tokens/s >= 1.5x vLLM's with the same configuration.

The shape section's rows add the speed-up the step costs predict at the measured acceptance
(mean acceptance length over the verify step's cost in plain steps); the draft rows add
Leviathan et al.'s prediction from the acceptance rate ``a`` and the draft's cost ``c``, and
whether the measured speed-up is within 15% of it; beside it the same formula with the verify
step's measured cost in place of its assumed one step (``predicted_with_verify_cost``).
"""

from __future__ import annotations

import hashlib
import json

from nanoserve.bench.spec_arms import predicted_speedup

TARGETS = {("copy", 1): 2.0, ("copy", "batch"): 1.3, ("norepeat", 1): 0.95,
           ("norepeat", "batch"): 0.95, ("vllm", 1): 1.5}
KEY = ("section", "engine", "model", "dtype", "workload", "batch", "threads")


def _target(r: dict) -> float | None:
    if r.get("spec") is None or r["spec"]["method"] != "ngram":
        return None
    return TARGETS.get((r["section"], 1 if r["batch"] == 1 else "batch"))


def summarize(report: dict) -> None:
    """Best rounds, ratios over off, identity, targets and predictions into the rows (in place);
    the outputs are replaced by a digest once compared."""
    rows = report["rows"]
    for r in rows:
        rounds = r.get("rounds") or []
        if r["status"] != "ok" or not rounds:
            continue
        for key in ("decode_tokens_per_s", "e2e_tokens_per_s"):
            got = [x[key] for x in rounds if x.get(key)]
            r[key] = round(max(got), 2) if got else None
            r[f"{key}_rounds"] = [round(x, 1) for x in got]
        for key in ("mean_acceptance_length", "acceptance_rate"):
            if r.get(key) is not None:
                r[key] = round(r[key], 4)
    off = {tuple(r[k] for k in KEY): r for r in rows if r.get("spec") is None}
    for r in rows:
        base = off.get(tuple(r[k] for k in KEY))
        if r.get("spec") is None or base is None or not r.get("decode_tokens_per_s") \
                or not base.get("decode_tokens_per_s"):
            continue
        r["speedup_decode"] = round(r["decode_tokens_per_s"] / base["decode_tokens_per_s"], 3)
        r["speedup_e2e"] = round(r["e2e_tokens_per_s"] / base["e2e_tokens_per_s"], 3)
        if "outputs" in r and "outputs" in base:
            r["identical_to_off"] = r["outputs"] == base["outputs"]
        t = _target(r)
        if t is not None:
            r["target"], r["met"] = t, r["speedup_decode"] >= t
    _shape_predictions(report)
    _draft_predictions(rows)
    _vllm_ratios(rows)
    for r in rows:
        if "outputs" in r:
            blob = json.dumps(r.pop("outputs")).encode()
            r["outputs_sha1"] = hashlib.sha1(blob).hexdigest()[:12]
    report["targets"] = [
        {k: r.get(k) for k in (*KEY, "arm", "speedup_decode", "ratio_over_vllm",
                               "mean_acceptance_length", "target", "met")}
        for r in rows if r.get("target") is not None]


def _shape_predictions(report: dict) -> None:
    costs = {c["threads"]: c for c in report.get("step_costs", [])}
    for r in report["rows"]:
        c = costs.get(r["threads"])
        if r["section"] != "shape" or r.get("spec") is None or c is None \
                or r.get("mean_acceptance_length") is None:
            continue
        k = r["spec"]["num_speculative_tokens"]
        ratio = c["ratio"].get(k) or c["ratio"].get(str(k))
        if ratio:
            r["verify_cost_in_steps"] = ratio
            r["predicted_from_step_cost"] = round(r["mean_acceptance_length"] / ratio, 3)


def _draft_predictions(rows: list[dict]) -> None:
    for r in rows:
        if r["section"] != "draft" or r.get("spec") is None or r.get("acceptance_rate") is None:
            continue
        a, k, c = r["acceptance_rate"], r["spec"]["num_speculative_tokens"], r["c"]
        r["predicted_speedup"] = round(predicted_speedup(a, k, c), 3)
        if r.get("verify_cost_in_steps"):  # the same with the verify step's measured cost
            r["predicted_with_verify_cost"] = round(
                predicted_speedup(a, k, c, r["verify_cost_in_steps"]), 3)
        if r.get("speedup_decode"):
            r["measured_over_predicted"] = round(r["speedup_decode"] / r["predicted_speedup"],
                                                 3)
            r["within_15pct"] = abs(r["measured_over_predicted"] - 1) <= 0.15


def _vllm_ratios(rows: list[dict]) -> None:
    ours = {(r["model"], r["dtype"], r["workload"], r["arm"]): r for r in rows
            if r["section"] == "copy" and r["batch"] == 1 and r["threads"] == 1}
    for r in rows:
        if r["section"] != "vllm" or not r.get("decode_tokens_per_s"):
            continue
        mine = ours.get((r["model"], r["dtype"], r["workload"], r["arm"]))
        if mine is None or not mine.get("decode_tokens_per_s"):
            continue
        r["nanoserve_decode_tokens_per_s"] = mine["decode_tokens_per_s"]
        r["nanoserve_mean_acceptance_length"] = mine.get("mean_acceptance_length")
        r["ratio_over_vllm"] = round(mine["decode_tokens_per_s"] / r["decode_tokens_per_s"], 3)
        if r.get("outputs") is not None and mine.get("outputs") is not None:
            r["same_outputs_as_nanoserve"] = r["outputs"] == mine["outputs"]
        if r.get("spec") is not None:
            r["target"], r["met"] = 1.5, r["ratio_over_vllm"] >= 1.5


# ------------------------------------------------------------------------------- tables

TITLES = {"copy": "1. copy-heavy prompts: ngram against off",
          "norepeat": "2. no-repeat prompts: ngram against off",
          "shape": "3. random-weight shape, forced repeats, one request",
          "draft": "4. draft model: measured against predicted",
          "vllm": "5. vLLM's CPU build, same speculative_config, one request at a time"}


def _f(r: dict, key: str, fmt: str) -> str:
    v = r.get(key)
    return "" if v is None else fmt.format(v)


def print_report(report: dict) -> None:
    """One table per section on stderr, each naming the machine, then the step costs."""
    from rich.console import Console
    from rich.table import Table

    from nanoserve.bench.hardware import describe_hardware

    console = Console(stderr=True, width=230)
    hw = describe_hardware(report["hardware"])
    for section, title in TITLES.items():
        rows = [r for r in report["rows"] if r["section"] == section]
        if not rows:
            continue
        t = Table(title=f"nanoserve bench spec: {title}", caption_justify="left",
                  caption=f"Hardware: {hw}. {report['figures']} Arms: ngram K MIN:MAX (k, "
                      f"prompt_lookup_min, prompt_lookup_max).")
        for col in ("model", "dtype", "workload", "batch", "threads", "engine", "arm",
                    "decode tok/s", "e2e tok/s", "x off", "x off e2e", "MAL", "accept", "drafts",
                    "= off", "extra", "target", "met"):
            t.add_column(col, justify="right" if col in ("batch", "threads", "drafts")
                         or "tok" in col
                         or col.startswith("x") else "left")
        notes = []
        for r in rows:
            if r["status"] != "ok":
                notes.append(f"{r['arm']} ({r['workload']}, batch {r['batch']}, "
                             f"{r.get('threads')} thr): {r['status']}: {r.get('reason')}")
            t.add_row(r["model"], r["dtype"], r["workload"], str(r["batch"]),
                      str(r.get("threads", "")).split(" on cores")[0], r["engine"],
                      r["arm"].replace("ngram k=", "ngram ").replace(" min=", " ")
                      .replace(" max=", ":"),
                      _f(r, "decode_tokens_per_s", "{:.1f}") or r["status"],
                      _f(r, "e2e_tokens_per_s", "{:.1f}"), _f(r, "speedup_decode", "{:.2f}x"),
                      _f(r, "speedup_e2e", "{:.2f}x"),
                      _f(r, "mean_acceptance_length", "{:.2f}"),
                      _f(r, "acceptance_rate", "{:.0%}"), _f(r, "num_drafts", "{}"),
                      "" if r.get("identical_to_off") is None
                      else ("yes" if r["identical_to_off"] else "NO"), _extra(r),
                      _f(r, "target", ">= {:.2f}x"),
                      "" if r.get("met") is None else ("yes" if r["met"] else "no"))
        console.print(t)
        for line in notes + report.get("notes", {}).get(section, []):
            console.print(f"  {line}", highlight=False, markup=False)
    for c in report.get("step_costs", []):
        _cost_table(console, c, hw)


def _extra(r: dict) -> str:
    if r["section"] == "shape" and r.get("predicted_from_step_cost") is not None:
        return (f"verify {r['verify_cost_in_steps']:.2f} steps: predicted "
                f"{r['predicted_from_step_cost']:.2f}x; ref {r['reference_shared']}")
    if r["section"] == "draft" and r.get("c") is not None:
        out = f"c={r['c']:.2f}"
        if r.get("predicted_speedup") is not None:
            out += f", predicted {r['predicted_speedup']:.2f}x"
        if r.get("within_15pct") is not None:
            out += f", within 15%: {'yes' if r['within_15pct'] else 'no'}"
        if r.get("predicted_with_verify_cost") is not None:
            out += (f"; verify={r['verify_cost_in_steps']:.2f} steps: "
                    f"{r['predicted_with_verify_cost']:.2f}x")
        return out
    if r["section"] == "vllm" and r.get("ratio_over_vllm") is not None:
        mal = r.get("nanoserve_mean_acceptance_length")
        return (f"nanoserve {r['nanoserve_decode_tokens_per_s']:.1f} tok/s"
                + (f" (MAL {mal:.2f})" if mal is not None else "")
                + f", {r['ratio_over_vllm']:.2f}x vLLM")
    if r.get("reference_shared") is not None:
        return f"ref {r['reference_shared']} (leading tokens shared)"
    return ""


def _cost_table(console, c: dict, hw: str) -> None:
    from rich.table import Table

    t = Table(title=f"verify step (Engine.score, 1 + k tokens) against a plain decode step "
                    f"(Engine.decode): {c['model']}, {c['dtype']}, {c['threads']} thread(s), "
                    f"batch {c['batch']}, context {c['context']}",
              caption=f"Hardware: {hw}. Median of {c['reps']} calls on a warm engine.",
              caption_justify="left")
    for col in ("k", "verify ms", "decode ms", "verify / decode"):
        t.add_column(col, justify="right")
    for k, ms in c["verify_ms"].items():
        t.add_row(str(k), f"{ms:.3f}", f"{c['decode_ms']:.3f}", f"{c['ratio'][k]:.2f}")
    console.print(t)
