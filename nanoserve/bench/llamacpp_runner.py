"""The llama.cpp side of ``nanoserve bench quant``: one GGUF timed in llama.cpp's own venv.

Why this module exists: llama.cpp (through ``llama-cpp-python``) is built for this CPU in its own
venv, ``.venv-llamacpp`` (``make .venv-llamacpp/.setup-stamp``), and cannot be imported beside
nanoserve's. ``quant.py`` starts this file as a script under that venv's Python::

    python llamacpp_runner.py '{"model": "x.gguf", "threads": 1, "prompt": [ids],
                                "new_tokens": 128, "rounds": 3}'

and reads one JSON object from its stdout. ``cpus`` (optional) pins the process to those CPUs;
an untimed warm-up (the prompt and 8 steps) runs first unless ``"warmup": false``. Per round it
clears the context, evaluates the prompt in one batch (the prompt time, up to and including the
first token's logits), then runs ``new_tokens - 1`` greedy decode steps, one token each (argmax
of the last logits, EOS ignored), timing them apart: decode tokens/s is those steps over their
wall time, the same count nanoserve's report uses (from its first token to its last). The
answer holds every round, the best round's figures and the greedy tokens, so the caller can
compare them with nanoserve's. ``logits_all`` is off (only the last row's logits are computed,
as in any server), ``n_batch`` covers the whole prompt, and ``n_threads`` serves both prompt and
decode.

This file imports only llama_cpp, numpy and the standard library; llama.cpp's log goes to
stderr.
"""

import json
import os
import sys
import time


def main() -> int:
    cfg = json.loads(sys.argv[1])
    if cfg.get("cpus"):  # the same cores nanoserve's threads are pinned to
        os.sched_setaffinity(0, cfg["cpus"])
    try:
        import llama_cpp
        import numpy as np
        from llama_cpp import Llama

        prompt, new = [int(t) for t in cfg["prompt"]], int(cfg["new_tokens"])
        t0 = time.perf_counter()
        llm = Llama(model_path=cfg["model"], n_threads=cfg["threads"],
                    n_threads_batch=cfg["threads"], n_ctx=cfg.get("n_ctx", 512),
                    n_batch=max(len(prompt), 32), n_ubatch=max(len(prompt), 32),
                    logits_all=False, verbose=bool(cfg.get("verbose", False)), seed=0)
        load_s = time.perf_counter() - t0
        n_vocab = llm.n_vocab()

        def last_argmax() -> int:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                           shape=(n_vocab,))
            return int(logits.argmax())

        rounds = []
        if cfg.get("warmup", True):  # untimed: the mapped file paged in, the buffers made
            llm.reset()
            llm.eval(prompt)
            for _ in range(8):
                llm.eval([last_argmax()])
        for _ in range(int(cfg.get("rounds", 3))):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompt)
            tokens = [last_argmax()]
            t1 = time.perf_counter()
            for _ in range(new - 1):
                llm.eval([tokens[-1]])
                tokens.append(last_argmax())
            t2 = time.perf_counter()
            rounds.append({"prompt_s": t1 - t0, "decode_s": t2 - t1,
                           "decode_tokens_per_s": (new - 1) / (t2 - t1), "tokens": tokens})
        best = max(rounds, key=lambda r: r["decode_tokens_per_s"])
        print(json.dumps({
            "version": f"llama-cpp-python {llama_cpp.__version__}",
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
            "threads": cfg["threads"], "load_s": load_s, "pid": os.getpid(),
            "rounds": [{k: v for k, v in r.items() if k != "tokens"} for r in rounds],
            "prompt_s": min(r["prompt_s"] for r in rounds),
            "decode_tokens_per_s": best["decode_tokens_per_s"], "tokens": best["tokens"],
            "same_tokens_every_round": all(r["tokens"] == best["tokens"] for r in rounds)}))
    except Exception as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
