"""make gpu-check: the one prepared script for a lent card, whole in under five minutes.

Why this file exists: a card is lent for minutes, by chance, to a machine with its own Python
3.12, its own torch and triton, no network and no fastapi, uvicorn or pydantic. So everything the
card has to do is decided here beforehand, in stages that each write their results the moment
they end (a stage that runs out of time or fails leaves the earlier ones on disk):

1. wheels: install ``build/gpu-wheels/*.whl`` (made here by ``make gpu-check-prepare``) into
   a private folder put first on the path, for this process and the servers it starts;
2. gpu tests: ``pytest -m gpu`` (the graph capture, the paged kernel, ...);
3. weights: random weights in the exact shape of Llama-3.2-1B, bf16, written with safetensors;
4. arms: ``graphbench.run_arms`` over those weights: graphs, eager (compiled) and no-compile
   servers, each under the same seeded load at rates 1, 2, 4 and 8 requests/s, ITL p50 and p99.

Each results file names the device, the torch and CUDA versions, the date and the command, as
``chapters/runner.py``'s ``gpu(...)`` claims require, plus the model, workload and batch size.
Without a card it says what it would run and exits 1, so no GPU claim is ever passed on a CPU.

    python tools/gpu_check.py                      # on the card (make gpu-check)
    python tools/gpu_check.py --plan               # print the stages, run nothing
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "build" / "gpu-wheels"
SITE = Path("/tmp/nanoserve-gpu-site")
RESULTS = ROOT / "chapters" / "day59_graphbench" / "results"
KERNEL_RESULTS = ROOT / "chapters" / "day62_kernel_in_engine" / "results" / "kernel.json"
WEIGHTS = Path("/tmp/nanoserve-llama-3.2-1b-random")
BUDGET_S = 285.0  # the whole script; the arms are started only while they still fit
ARMS = ("graphs", "eager", "no-compile")
RATES = (1.0, 2.0, 4.0, 8.0)
WORKLOAD = dict(requests=12, input_len=128, output_len=64, max_num_seqs=8, max_model_len=1024)


def stages(results: Path) -> list[tuple[str, str]]:
    w = WORKLOAD
    return [
        ("wheels", f"pip install --no-index --no-deps --target {SITE} {WHEELS}/*.whl"),
        ("gpu tests", f"{sys.executable} -m pytest -q -m gpu {' '.join(gpu_test_files())} "
                      f"-> {results}/gpu-tests.json"),
        ("kernel", f"{sys.executable} -m chapters.day62_kernel_in_engine.bench --out "
                   f"{KERNEL_RESULTS}"),
        ("weights", f"random Llama-3.2-1B-shaped bf16 safetensors -> {WEIGHTS}"),
        ("arms", f"graphbench --weights {WEIGHTS} --device cuda --rates "
                 f"{','.join(f'{r:g}' for r in RATES)} --arms {','.join(ARMS)} "
                 f"--arm-requests {w['requests']} --input-len {w['input_len']} --output-len "
                 f"{w['output_len']} --max-num-seqs {w['max_num_seqs']} --max-model-len "
                 f"{w['max_model_len']} --dtype bfloat16 -> {results}/graphbench-arms.json"),
    ]


def header(command: str) -> dict:
    """What every results file names: the card, torch, CUDA, the date and the command."""
    import torch

    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": dt.date.today().isoformat(),
            "command": command, "python": sys.version.split()[0]}


class Results:
    """One JSON file per stage, written whole as soon as the stage ends (and copied to $OUT,
    which is what comes back from a lent machine)."""

    def __init__(self, folder: Path, command: str):
        self.folder, self.command = folder, command
        self.copy_to = Path(os.environ["OUT"]) if os.environ.get("OUT") else None

    def write(self, name: str, stage: str, values: dict, **extra) -> Path:
        body = header(self.command) | {"stage": stage, **extra, "values": values}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / name
        path.write_text(json.dumps(body, indent=1) + "\n")
        if self.copy_to is not None:
            shutil.copy(path, self.copy_to / name)
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


def run_gpu_tests(results: Results, deadline: float) -> bool:
    t0 = time.perf_counter()
    report = ROOT / "build" / "gpu-tests.xml"
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", *gpu_test_files(),
           "-p", "no:cacheprovider", f"--junitxml={report}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       timeout=max(30.0, deadline - time.perf_counter()))
    print(r.stdout[-4000:], r.stderr[-2000:], sep="\n", flush=True)
    tail = [line for line in r.stdout.splitlines() if line.strip()][-1:] or [""]
    results.write("gpu-tests.json", "gpu tests",
                  {"returncode": r.returncode, "passed": r.returncode == 0,
                   "summary": tail[0], "seconds": round(time.perf_counter() - t0, 1)},
                  tests=shlex.join(cmd[1:]))
    return r.returncode == 0


def run_kernel_bench(deadline: float) -> bool:
    """Day 62's kernel against the gathered path, timed on the card: results/kernel.json."""
    import subprocess

    cmd = [sys.executable, "-m", "chapters.day62_kernel_in_engine.bench", "--out",
           str(KERNEL_RESULTS)]
    left = max(10.0, min(90.0, deadline - time.perf_counter() - 150.0))  # leave the arms room
    try:
        done = subprocess.run(cmd, cwd=ROOT, timeout=left)
    except subprocess.TimeoutExpired:
        return False
    if done.returncode == 0 and KERNEL_RESULTS.is_file() and os.environ.get("OUT"):
        import shutil

        shutil.copy(KERNEL_RESULTS, Path(os.environ["OUT"]) / KERNEL_RESULTS.name)
    return done.returncode == 0


def write_weights(folder: Path, seed: int = 0, cfg: dict | None = None,
                  device: str = "cuda") -> dict:
    """Random bf16 weights in the exact shape of Llama-3.2-1B (or ``cfg``'s), in HF's names
    and layout, drawn on ``device`` (a card draws 1.2 billion of them in well under a second)."""
    import torch
    from safetensors.torch import save_file

    from nanoserve.bench.shapes import SHAPES

    cfg = dict(cfg or SHAPES["llama-3.2-1b"])
    E, inter, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    D, hq, hkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()

    ones = torch.ones(E, dtype=torch.bfloat16)
    state = {"model.embed_tokens.weight": rand(cfg["vocab_size"], E),
             "model.norm.weight": ones.clone()}
    for i in range(L):
        p = f"model.layers.{i}."
        state |= {p + "input_layernorm.weight": ones.clone(),
                  p + "post_attention_layernorm.weight": ones.clone(),
                  p + "self_attn.q_proj.weight": rand(hq * D, E),
                  p + "self_attn.k_proj.weight": rand(hkv * D, E),
                  p + "self_attn.v_proj.weight": rand(hkv * D, E),
                  p + "self_attn.o_proj.weight": rand(E, hq * D),
                  p + "mlp.gate_proj.weight": rand(inter, E),
                  p + "mlp.up_proj.weight": rand(inter, E),
                  p + "mlp.down_proj.weight": rand(E, inter)}
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
    ap.add_argument("--results", type=Path, default=RESULTS, help="where results JSON goes")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    args = ap.parse_args(argv)
    plan = stages(args.results)
    if args.plan:
        for i, (name, what) in enumerate(plan, 1):
            print(f"{i}. {name}: {what}")
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
        for i, (name, what) in enumerate(plan, 1):
            print(f"  {i}. {name}: {what}")
        return 1
    command = "make gpu-check (python tools/gpu_check.py " + shlex.join(argv or sys.argv[1:]) \
        + ")"
    print(f"[gpu-check] wheels: {install_wheels()}", flush=True)
    results = Results(args.results, command)
    ok = run_gpu_tests(results, deadline)
    print(f"[gpu-check] gpu tests {'passed' if ok else 'FAILED'} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    kernel = run_kernel_bench(deadline)
    print(f"[gpu-check] kernel timing {'written' if kernel else 'FAILED'} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
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
    passed = ok and kernel and not report["skipped"] and all(v.startswith("PASS") for v in gates)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
