"""make gpu-check: the one prepared script for a lent card, whole in under five minutes.

Why this file exists: a card is lent for minutes, by chance, to a machine with its own Python
3.12, its own torch and triton, no network and no fastapi, uvicorn or pydantic. So everything the
card has to do is decided here beforehand, in six stages that each write their results the
moment they end (a stage that runs out of time or fails leaves the earlier ones on disk):

1. wheels: install ``build/gpu-wheels/*.whl`` (made here by ``make gpu-check-prepare``) into
   a private folder put first on the path, for this process and the servers it starts;
2. gpu tests: ``pytest -m gpu`` (the graph capture, the paged kernel, ...): Day 59's
   ``results/gpu-tests.json``;
3. capture: Day 57's windows captured as CUDA graphs on nanoserve-tiny, the worst shape's
   tokens against the eager forward, its replay share and addresses
   (``chapters.day57_graph_capture.bench``): Day 57's ``results/capture.json``;
4. kernel: Day 62's Triton kernel against the gathered path, and its bf16 error
   (``chapters.day62_kernel_in_engine.bench``): Day 62's ``results/kernel.json``;
5. weights: random weights in the exact shape of Llama-3.2-1B, bf16, written with safetensors:
   Day 59's ``results/gpu-weights.json``;
6. arms: ``graphbench.run_arms`` over those weights: graphs, eager (compiled) and no-compile
   servers, each under the same seeded load at rates 1, 2, 4 and 8 requests/s, ITL p50 and p99:
   Day 59's ``results/graphbench-arms.json``.

Those five files are every file a ``gpu(...)`` claim of the book reads (tests/test_gpu_check.py
holds the plan to that), so one run makes every single-card row. Rows that need two cards
(Day 66's NCCL row) are not ``gpu`` claims: they read "skipped: needs 2 GPUs" and no stage
here runs them. The budget: each stage before the arms has a ceiling (``CEILING_S``) and never
eats into the ``ARMS_RESERVE_S`` the arms are promised; an arm that would start too late is
named as skipped rather than run half.

Each results file names the device, the torch and CUDA versions, the date and the command, as
``chapters/runner.py``'s ``gpu(...)`` claims require, plus the model and workload. Each is also
copied to ``$OUT`` under its path in the repository, which is what comes back from a lent
machine: ``cp -r <files_at>/chapters .`` puts them where the chapters read them. Without a card
it says what it would run and exits 1, so no GPU claim is ever passed on a CPU.

    python tools/gpu_check.py                      # on the card (make gpu-check)
    python tools/gpu_check.py --plan               # print the stages and their files, run nothing
    python tools/gpu_check.py --results DIR        # every results file into DIR instead
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "build" / "gpu-wheels"
SITE = Path("/tmp/nanoserve-gpu-site")
CHAPTERS = ROOT / "chapters"
DAY57 = CHAPTERS / "day57_graph_capture" / "results"
DAY59 = CHAPTERS / "day59_graphbench" / "results"
DAY62 = CHAPTERS / "day62_kernel_in_engine" / "results"
WEIGHTS = Path("/tmp/nanoserve-llama-3.2-1b-random")
BUDGET_S = 285.0  # the whole script; the arms are started only while they still fit
ARMS_RESERVE_S = 150.0  # what the stages before the arms leave for them
CEILING_S = {"gpu tests": 75.0, "capture": 45.0, "kernel": 90.0}  # each stage's own limit
ARMS = ("graphs", "eager", "no-compile")
RATES = (1.0, 2.0, 4.0, 8.0)
WORKLOAD = dict(requests=12, input_len=128, output_len=64, max_num_seqs=8, max_model_len=1024)


@dataclass(frozen=True, slots=True)
class Stage:
    """One step of the card's run: its name, what it runs, and the results files it writes."""

    name: str
    what: str
    writes: tuple[Path, ...] = ()
    argv: tuple[str, ...] = ()  # python's arguments, for a stage run as its own process


def results_paths(results: Path | None = None) -> dict[str, Path]:
    """Where each results file goes: its chapter's results/, or all into ``results``."""
    default = {"gpu-tests.json": DAY59, "capture.json": DAY57, "kernel.json": DAY62,
               "gpu-weights.json": DAY59, "graphbench-arms.json": DAY59}
    return {name: (results or folder) / name for name, folder in default.items()}


def stages(results: Path | None = None) -> list[Stage]:
    """The plan, in the order the card runs it. ``results``: one folder for every file."""
    w, out = WORKLOAD, results_paths(results)

    def module(name: str, module: str, file: str) -> Stage:
        argv = ("-m", module, "--out", _shown(out[file]))  # run from the repository root
        return Stage(name, "python " + shlex.join(argv), (out[file],), argv)

    return [
        Stage("wheels", f"pip install --no-index --no-deps --target {SITE} "
                        f"{_shown(WHEELS)}/*.whl"),
        Stage("gpu tests", f"python -m pytest -q -m gpu {' '.join(gpu_test_files())}",
              (out["gpu-tests.json"],)),
        module("capture", "chapters.day57_graph_capture.bench", "capture.json"),
        module("kernel", "chapters.day62_kernel_in_engine.bench", "kernel.json"),
        Stage("weights", f"random Llama-3.2-1B-shaped bf16 safetensors -> {WEIGHTS}",
              (out["gpu-weights.json"],)),
        Stage("arms", f"graphbench --weights {WEIGHTS} --device cuda --rates "
                      f"{','.join(f'{r:g}' for r in RATES)} --arms {','.join(ARMS)} "
                      f"--arm-requests {w['requests']} --input-len {w['input_len']} "
                      f"--output-len {w['output_len']} --max-num-seqs {w['max_num_seqs']} "
                      f"--max-model-len {w['max_model_len']} --dtype bfloat16",
              (out["graphbench-arms.json"],)),
    ]


def show_plan(plan: list[Stage], indent: str = "") -> str:
    lines = []
    for i, s in enumerate(plan, 1):
        limit = f" (at most {CEILING_S[s.name]:g} s)" if s.name in CEILING_S else ""
        lines.append(f"{indent}{i}. {s.name}{limit}: {s.what}")
        lines += [f"{indent}   writes {_shown(p)}" for p in s.writes]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def header(command: str) -> dict:
    """What every results file names: the card, torch, CUDA, the date and the command."""
    import torch

    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": dt.date.today().isoformat(),
            "command": command, "python": sys.version.split()[0]}


def copy_out(path: Path) -> None:
    """A results file into $OUT (what comes back from a lent machine), under its path in the
    repository where it has one."""
    if not os.environ.get("OUT") or not path.is_file():
        return
    dest = Path(os.environ["OUT"]) / (path.relative_to(ROOT) if path.is_relative_to(ROOT)
                                      else path.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, dest)


class Results:
    """The results files this process writes itself, each whole as soon as its stage ends."""

    def __init__(self, paths: dict[str, Path], command: str):
        self.paths, self.command = paths, command

    def write(self, name: str, stage: str, values: dict, **extra) -> Path:
        body = header(self.command) | {"stage": stage, **extra, "values": values}
        path = self.paths[name]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(body, indent=1) + "\n")
        copy_out(path)
        print(f"[gpu-check] wrote {path}", flush=True)
        return path


def install_wheels() -> str:
    wheels = sorted(WHEELS.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"[gpu-check] no wheels in {WHEELS}: run make gpu-check-prepare here "
                         f"and carry build/gpu-wheels with the tree")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE),
                    *map(str, wheels)], check=True)
    # first on the path, here and in every server this script starts
    sys.path.insert(0, str(SITE))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return f"{len(wheels)} wheels into {SITE}"


def gpu_test_files() -> list[str]:
    """Only the test files that hold gpu tests: collecting the rest would import packages the
    card lacks (the openai client, ...) and fail the stage for reasons that are not the card."""
    return sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").glob("test_*.py")
                  if "mark.gpu" in f.read_text())


def time_left(stage: str, deadline: float) -> float:
    """A stage's timeout: its ceiling, cut so that the arms keep their reserve (10 s at least)."""
    return max(10.0, min(CEILING_S[stage], deadline - time.perf_counter() - ARMS_RESERVE_S))


def run_gpu_tests(results: Results, deadline: float) -> bool:
    t0 = time.perf_counter()
    report = ROOT / "build" / "gpu-tests.xml"
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", *gpu_test_files(),
           "-p", "no:cacheprovider", f"--junitxml={report}"]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                           timeout=time_left("gpu tests", deadline))
        code, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = -1, _text(e.stdout) + "\n(timed out)", _text(e.stderr)
    print(out[-4000:], err[-2000:], sep="\n", flush=True)
    tail = [line for line in out.splitlines() if line.strip()][-1:] or [""]
    results.write("gpu-tests.json", "gpu tests",
                  {"returncode": code, "passed": code == 0,
                   "summary": tail[0], "seconds": round(time.perf_counter() - t0, 1)},
                  tests=shlex.join(cmd[1:]))
    return code == 0


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def run_module_stage(stage: Stage, deadline: float) -> bool:
    """A stage that is a chapter's own ``bench`` module, run in its own process (a CUDA fault
    there cannot take this one down), which writes its results file itself."""
    try:
        done = subprocess.run([sys.executable, *stage.argv], cwd=ROOT,
                              timeout=time_left(stage.name, deadline))
    except subprocess.TimeoutExpired:
        print(f"[gpu-check] {stage.name}: timed out", flush=True)
        return False
    for path in stage.writes:
        copy_out(path)
    return done.returncode == 0 and all(p.is_file() for p in stage.writes)


def weight_shapes(cfg: dict | None = None) -> dict[str, tuple[int, ...]]:
    """The tensors ``write_weights`` writes, name -> shape, in HF's Llama names and layout
    (Llama-3.2-1B's, or ``cfg``'s; tied embeddings, so no ``lm_head``). Nothing is drawn, so
    the parameter count a card will write is known on any machine."""
    from nanoserve.bench.shapes import SHAPES

    cfg = cfg or SHAPES["llama-3.2-1b"]
    E, inter, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    D, hq, hkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], E), "model.norm.weight": (E,)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (E,),
                   p + "post_attention_layernorm.weight": (E,),
                   p + "self_attn.q_proj.weight": (hq * D, E),
                   p + "self_attn.k_proj.weight": (hkv * D, E),
                   p + "self_attn.v_proj.weight": (hkv * D, E),
                   p + "self_attn.o_proj.weight": (E, hq * D),
                   p + "mlp.gate_proj.weight": (inter, E),
                   p + "mlp.up_proj.weight": (inter, E),
                   p + "mlp.down_proj.weight": (E, inter)}
    return shapes


def write_weights(folder: Path, seed: int = 0, cfg: dict | None = None,
                  device: str = "cuda") -> dict:
    """Random bf16 weights in ``weight_shapes(cfg)``, drawn on ``device`` (a card draws 1.2
    billion of them in well under a second); norms are ones, the rest N(0, 0.02)."""
    import torch
    from safetensors.torch import save_file

    from nanoserve.bench.shapes import SHAPES

    cfg = dict(cfg or SHAPES["llama-3.2-1b"])
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            state[name] = (torch.randn(*shape, generator=gen, device=device) * 0.02
                           ).to(torch.bfloat16).cpu()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(folder, cfg["vocab_size"])
    return {"parameters": sum(t.numel() for t in state.values()), "dtype": "bfloat16",
            "shape": "llama-3.2-1b" if cfg == SHAPES["llama-3.2-1b"] else "custom",
            "seed": seed}


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer with one word per id ("t0 ", "t1 ", ...): random weights come
    with no tokenizer, and the serving benchmark counts tokens by the text of each chunk."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="store_true", help="print the stages and exit 0")
    ap.add_argument("--results", type=Path, default=None,
                    help="one folder for every results file (default: each chapter's results/)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    args = ap.parse_args(argv)
    plan = stages(args.results)
    if args.plan:
        print(show_plan(plan))
        return 0
    t0 = time.perf_counter()
    deadline = t0 + args.budget
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        print("[gpu-check] no CUDA device here: nothing is measured and no GPU claim passes.")
        print("[gpu-check] on a lent card it would run, in this order, each stage writing its "
              "results as it ends:")
        print(show_plan(plan, "  "))
        return 1
    command = "make gpu-check (python tools/gpu_check.py " + shlex.join(argv or sys.argv[1:]) \
        + ")"
    by_name = {s.name: s for s in plan}
    print(f"[gpu-check] wheels: {install_wheels()}", flush=True)
    results = Results(results_paths(args.results), command)
    ok = {"gpu tests": run_gpu_tests(results, deadline)}
    for name in ("capture", "kernel"):
        ok[name] = run_module_stage(by_name[name], deadline)
    for name, passed in ok.items():
        print(f"[gpu-check] {name} {'done' if passed else 'FAILED'}", flush=True)
    print(f"[gpu-check] {time.perf_counter() - t0:.0f} s so far", flush=True)
    t1 = time.perf_counter()
    weights = write_weights(WEIGHTS)
    print(f"[gpu-check] weights: {weights} in {time.perf_counter() - t1:.0f} s", flush=True)
    results.write("gpu-weights.json", "weights",
                  weights | {"seconds": round(time.perf_counter() - t1, 1)}, path=str(WEIGHTS))
    from nanoserve.bench import graphbench

    w = WORKLOAD

    def save(report: dict) -> None:
        results.write("graphbench-arms.json", "arms", {"rows": report["rows"],
                      "gates": report["gates"]}, model=report["model"] + " (random weights)",
                      hardware=report["hardware"], workload=report["workload"],
                      batch_size=report["batch_size"], windows=report["windows"],
                      arm_seconds=report.get("arm_seconds", {}), skipped=report["skipped"],
                      weights=weights)

    report = graphbench.run_arms(
        str(WEIGHTS), "cuda", list(RATES), ARMS, w["requests"], w["input_len"],
        w["output_len"], w["max_num_seqs"], w["max_model_len"], "bfloat16",
        server_timeout_s=max(60.0, deadline - time.perf_counter()), on_arm=save,
        deadline=deadline)  # an arm that would start too late is named as skipped
    print(graphbench.render_arms(report), flush=True)
    print(f"[gpu-check] done in {time.perf_counter() - t0:.0f} s; "
          f"skipped: {report['skipped'] or 'none'}")
    gates = report["gates"].values()
    passed = (all(ok.values()) and not report["skipped"]
              and all(v.startswith("PASS") for v in gates))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
