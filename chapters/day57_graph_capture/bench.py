"""Day 57 on a card: the windows captured as CUDA graphs, and results/capture.json.

    python -m chapters.day57_graph_capture.bench \
        --out chapters/day57_graph_capture/results/capture.json
    python -m chapters.day57_graph_capture.bench --dry     # this machine, writes nothing

Why this file exists: the chapter's last four rows need windows really recorded, which only a
card can do, and a card is lent for minutes. ``make gpu-check`` runs this module as its
"capture" stage; on a CUDA machine ``make chapter-57`` calls ``capture_run("cuda")`` directly.
The run is the chapter's worst shape (8 slots, 16 requests with 4-token prompts wanting 4, 8,
16 or 32 tokens, greedy, EOS ignored, nanoserve-tiny in float32, gathered attention): once with
windows off and the persistent batch on, once with windows on, the tokens compared, the replay
share read from the engine's counters and the seven addresses the windows hold compared before
and after. Everything but the recording itself runs the same on a CPU, where the windows replay
eagerly: ``--dry`` and ``tests/test_gpu_check.py`` run it that way.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
from pathlib import Path

COMMAND = ("python -m chapters.day57_graph_capture.bench --out "
           "chapters/day57_graph_capture/results/capture.json")


@functools.cache
def capture_run(device: str = "cuda") -> dict:
    """The worst shape with windows off, then on, on ``device``; the values capture.json holds."""
    from nanoserve import LLM

    from .claims import PROMPTS, REQUESTS, SLOTS, params

    kw = dict(device=device, dtype="float32", max_num_seqs=SLOTS, max_model_len=64,
              skip_tokenizer_init=True, enable_chunked_prefill=False, attention="gathered")
    eager = [o.token_ids for o in LLM(compact_rows=True, **kw).generate(PROMPTS, params())]
    llm = LLM(cuda_graphs=True, **kw)
    g = llm.engine.graphs
    before = g._current_addresses()
    got = [o.token_ids for o in llm.generate(PROMPTS, params())]
    after = g._current_addresses()
    s = llm.stats
    return {"mode": g.mode, "captured": sorted(g.graphs), "sizes": list(g.sizes),
            "requests": REQUESTS,
            "differ": sum(a != b for a, b in zip(eager, got, strict=True)),
            "decode_steps": s.decode_steps, "replayed": s.decode_steps_replayed,
            "share": s.replay_share,
            "addresses": {"same": sum(before[k] == v for k, v in after.items()),
                          "held": len(before)}}


def results(values: dict, head: dict) -> dict:
    """The results file: ``head`` (device, torch, cuda, date, command) and the values."""
    return head | {"model": "nanoserve-tiny (float32)",
                   "workload": "8 slots; 16 requests, 4-token prompts, 4/8/16/32 tokens each, "
                               "greedy, EOS ignored; max_model_len 64; gathered attention",
                   "values": values}


def card_header() -> dict:
    import torch

    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": datetime.date.today().isoformat(),
            "command": COMMAND}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m chapters.day57_graph_capture.bench")
    ap.add_argument("--out", type=Path, help="where to write the results JSON (needs CUDA)")
    ap.add_argument("--dry", action="store_true",
                    help="run it on this machine's device and print the values; write nothing")
    args = ap.parse_args(argv)
    import torch

    if args.dry:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(json.dumps(capture_run(device), indent=1))
        return 0
    if not torch.cuda.is_available():
        print("capture needs CUDA; --dry runs the same code here without a recording",
              file=sys.stderr)
        return 1
    data = results(capture_run("cuda"), card_header())
    print(json.dumps(data, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
