"""``nanoserve serve``: the OpenAI-compatible server on one checkpoint, run by uvicorn.

Why this module exists: it is the one place where command-line flags become an engine. The flags
carry vLLM's names (``--max-model-len``, ``--num-kv-blocks``, ``--max-num-seqs``, ...) so an
operator's vLLM command line mostly works here; ``engine_options`` bundles them for ``LLM`` and
nothing else reads ``args``.

Shutdown is a drain. On SIGTERM (or Ctrl-C) the server marks itself draining (``/health`` and new
requests answer 503), stops accepting connections, and lets in-flight requests finish for up to
``--drain-timeout`` seconds; whatever is still running then is aborted. It exits 0 only if every
KV block is back in the pool.

    nanoserve serve                                  # the shipped model on 127.0.0.1:8000
    nanoserve serve --model ckpt/ --port 9000 --api-key sekrit --max-waiting 64
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

log = logging.getLogger("nanoserve.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: shipped tiny)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients send as `model` (default: the folder's name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--skip-tokenizer-init", action="store_true",
                   help="load no tokenizer: prompts must be token ids, no chat")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="refuse (429) a request that arrives while this many wait")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a jinja2 chat template, for checkpoints without one")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    # The speed options (Days 49, 50, 57, 58), each its own switch; engine_options bundles them.
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="decode through torch.compile (Day 49)")
    p.add_argument("--attention", choices=["reference", "gathered", "triton"],
                   default="gathered", help="the decode read: Day 28's rectangle, Day 50's "
                                            "gathered mapping or Week 14's Triton kernel")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="decode through recorded windows (Day 57); eager replay without CUDA; "
                        "turns on the persistent batch unless --no-persistent-batch")
    p.add_argument("--persistent-batch", dest="persistent_batch", action="store_true",
                   default=None, help="compact running rows to 0..n-1 (Day 58); unset: "
                                      "follows --cuda-graphs")
    p.add_argument("--no-persistent-batch", dest="persistent_batch", action="store_false",
                   help="never move a running request, even with --cuda-graphs")


def speed_options(args: argparse.Namespace) -> dict:
    """The four speed switches. The one bundling in the code base is here: an unset
    ``--persistent-batch`` follows ``--cuda-graphs``, since a capture that can replay only the
    steps whose rows happen to be a prefix is not what asking for graphs means."""
    follow = args.cuda_graphs if args.persistent_batch is None else args.persistent_batch
    return dict(compile=args.compile, attention=args.attention, cuda_graphs=args.cuda_graphs,
                compact_rows=follow)


def engine_options(args: argparse.Namespace) -> dict:
    """The engine's options from the flags: the only place they are bundled."""
    return dict(dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                max_num_seqs=args.max_num_seqs, skip_tokenizer_init=args.skip_tokenizer_init,
                **speed_options(args))


def build_engine(model: str | Path | None = None, *, max_waiting: int | None = None,
                 compile: bool | str = False, attention: str = "gathered",
                 cuda_graphs: bool = False, compact_rows: bool | None = None, **options):
    """An ``AsyncLLM`` over ``LLM(model, ...)``. Each speed option is its own argument and
    is passed on as given (``compact_rows=None`` lets ``LLM`` follow ``cuda_graphs``)."""
    from .async_engine import AsyncLLM
    from .llm import DEFAULT_MODEL, LLM

    llm = LLM(Path(model) if model else DEFAULT_MODEL, compile=compile, attention=attention,
              cuda_graphs=cuda_graphs, compact_rows=compact_rows, **options)
    return AsyncLLM(llm, max_waiting=max_waiting)


def make_server(app, engine, host: str, port: int, drain_timeout: float,
                log_level: str = "info"):
    """A uvicorn server whose first SIGTERM/SIGINT starts a drain: the app answers 503 to new
    requests, and ``engine.shutdown(drain_timeout)`` lets in-flight requests finish, then aborts
    the rest, so every stream still ends well-formed (``finish_reason="abort"``, ``[DONE]``) and
    uvicorn's own wait for open connections ends on its own. A second Ctrl-C forces the exit."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # uvicorn would re-raise a captured signal after shutdown, so the process would die
            # of SIGTERM; a drained server exits 0 instead, so this does not record it.
            if self.should_exit:
                self.force_exit = self.force_exit or sig == signal.SIGINT
                return
            app.state.draining = True
            self.should_exit = True
            loop = asyncio.get_running_loop()
            self.drain = loop.create_task(engine.shutdown(drain_timeout))

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=drain_timeout + 10)  # a backstop only
    return DrainingServer(config)


def main(args: argparse.Namespace) -> int:
    from .server import build_app

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:  %(message)s")
    for name, value, low in (("--max-body-bytes", args.max_body_bytes, 1),
                             ("--drain-timeout", args.drain_timeout, 0)):
        if value < low:
            print(f"nanoserve serve: error: {name} must be >= {low}, got {value}",
                  file=sys.stderr)
            return 2
    template = None
    if args.chat_template is not None:
        path = Path(args.chat_template)
        if not path.is_file():
            print(f"nanoserve serve: error: --chat-template {path} is not a file",
                  file=sys.stderr)
            return 2
        template = path.read_text()
    try:
        engine = build_engine(args.model, max_waiting=args.max_waiting,
                              **engine_options(args))
    except ValueError as e:
        print(f"nanoserve serve: error: {e}", file=sys.stderr)
        return 2
    graphs = engine.llm.engine.graphs
    if graphs is not None:  # say which kind of window this is: a CPU has no capture
        log.info("decode windows: %s over buckets %s", graphs.mode, graphs.sizes)
    name = args.served_model_name or Path(args.model or "nanoserve-tiny").resolve().name
    app = build_app(engine, name, api_key=args.api_key, chat_template=template,
                    max_body_bytes=args.max_body_bytes)
    server = make_server(app, engine, args.host, args.port, args.drain_timeout,
                         args.log_level)
    server.run()
    if not server.started:
        return 1
    pool = engine.llm.engine.allocator
    log.info("drained: %d of %d KV blocks free", pool.num_free, pool.num_blocks)
    return 0 if pool.num_free == pool.num_blocks else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="nanoserve serve")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
