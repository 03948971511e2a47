"""The vLLM side of ``nanoserve bench offline``: a long-lived process in vLLM's own venv.

Why this module exists: vLLM's CPU build pins its own torch and lives in ``.venv-vllm``, so it
cannot be imported beside nanoserve. ``vllm_engine.py`` starts this file as a script under that
venv's Python (``python vllm_runner.py CONFIG_JSON``) and talks to it in JSON lines:

- the runner's first line is ``{"event": "hello", "version": ..., "platform": ...}``, sent before
  the model loads, so a build for the wrong device is refused cheaply;
- ``{"event": "ready", ...}`` once ``vllm.LLM`` holds the checkpoint;
- for each ``{"cmd": "run", "prompts": [[ids]], "max_tokens": [n]}`` on stdin it runs one
  ``LLM.generate`` (token-id prompts, ``temperature=0``, ``ignore_eos=True``) and answers
  ``{"event": "result", "wall_s": ..., "token_ids": [[ids]]}``;
- ``{"cmd": "metrics"}`` answers ``{"event": "metrics", "metrics": {name: value}}``: vLLM's own
  counters from ``LLM.get_metrics()`` (a counter's value; a histogram's ``sum`` and ``count``),
  which need ``disable_log_stats: false`` among the options (``bench spec`` reads the
  speculative-decoding counters and the decode-time histogram from it);
- ``{"cmd": "quit"}`` (or EOF) ends it.

The protocol travels on the process's original stdout; everything vLLM prints is sent to stderr,
which the parent keeps in a log. This file imports only vllm and the standard library, and runs
only under the ``__main__`` guard: vLLM's engine core is a spawned process that re-imports the
main module.
"""

import json
import os
import sys
import time


def _send(stream, obj) -> None:
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def _metrics(llm) -> dict:
    """vLLM's metrics as numbers: a counter or gauge by its value, a histogram as NAME:sum and
    NAME:count, a vector (per-position counts) as a list; labels summed over."""
    out: dict = {}
    for m in llm.get_metrics():
        if hasattr(m, "buckets") or hasattr(m, "sum") and hasattr(m, "count"):
            out[f"{m.name}:sum"] = out.get(f"{m.name}:sum", 0.0) + float(m.sum)
            out[f"{m.name}:count"] = out.get(f"{m.name}:count", 0) + int(m.count)
        elif hasattr(m, "values"):
            old = out.get(m.name, [])
            old += [0] * (len(m.values) - len(old))
            out[m.name] = [a + (m.values[i] if i < len(m.values) else 0)
                           for i, a in enumerate(old)]
        elif hasattr(m, "value"):
            out[m.name] = out.get(m.name, 0) + m.value
    return out


def main() -> int:
    cfg = json.loads(sys.argv[1])
    proto = os.fdopen(os.dup(1), "w")  # our channel: the original stdout
    os.dup2(2, 1)  # vLLM's prints (and its child processes') go to stderr
    sys.stdout = sys.stderr
    try:
        import vllm
        from vllm import LLM, SamplingParams

        try:
            from vllm.platforms import current_platform
            platform = str(current_platform.device_type)
        except Exception as e:  # an older layout: say so, do not guess
            platform = f"unknown ({type(e).__name__})"
        _send(proto, {"event": "hello", "version": vllm.__version__, "platform": platform,
                      "pid": os.getpid(), "affinity": len(os.sched_getaffinity(0))})
        t0 = time.perf_counter()
        llm = LLM(model=cfg["model"], dtype=cfg["dtype"], max_model_len=cfg["max_model_len"],
                  max_num_seqs=cfg["max_num_seqs"], skip_tokenizer_init=True, seed=0,
                  **cfg.get("options", {}))
        _send(proto, {"event": "ready", "load_s": round(time.perf_counter() - t0, 2)})
    except Exception as e:
        _send(proto, {"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 1
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            break
        if msg.get("cmd") == "metrics":
            try:
                _send(proto, {"event": "metrics", "metrics": _metrics(llm)})
            except Exception as e:
                _send(proto, {"event": "error", "error": f"{type(e).__name__}: {e}"})
            continue
        try:
            params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=int(m),
                                     detokenize=False) for m in msg["max_tokens"]]
            prompts = [{"prompt_token_ids": [int(t) for t in p]} for p in msg["prompts"]]
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t0
            _send(proto, {"event": "result", "wall_s": wall,
                          "token_ids": [list(o.outputs[0].token_ids) for o in outs]})
        except Exception as e:
            _send(proto, {"event": "error", "error": f"{type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
