"""``nanoserve serve``: the OpenAI-compatible server on one checkpoint, run by uvicorn.

Why this module exists: it is where command-line flags become an engine. The engine's flags are
made from ``EngineConfig``'s fields (``EngineConfig.add_cli_args``), with vLLM's spellings
(``--max-model-len``, ``--max-num-seqs``, ...) and vLLM's aliases where ours differ
(``--num-gpu-blocks-override`` for ``--num-kv-blocks``), so an operator's vLLM command line
mostly works here. The server's own flags (host, port, key, limits, drain) are listed below;
``EngineConfig.from_cli_args`` is the only reader of the engine's.

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

from nanoserve.config import EngineConfig
from nanoserve.entrypoints.openai.reasoning import REASONING_PARSERS
from nanoserve.entrypoints.openai.tool_parsers import TOOL_PARSERS

log = logging.getLogger("nanoserve.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The server's flags, then every engine option (``EngineConfig.add_cli_args``)."""
    s = p.add_argument_group("server options")
    s.add_argument("--served-model-name", default=None,
                   help="the name clients send as `model` (default: the folder's name)")
    s.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000,
                   help="the port to listen on (default: 8000)")
    s.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on /v1, /tokenize and "
                        "/detokenize (default: none)")
    s.add_argument("--max-waiting", type=int, default=None,
                   help="refuse (429) a request that arrives while this many wait "
                        "(default: no limit)")
    s.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a jinja2 chat template, for checkpoints without one "
                        "(default: the checkpoint's)")
    s.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let the model decide to call a tool (tool_choice "auto"); needs '
                        '--tool-call-parser')
    s.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                   help="the format the model writes its tool calls in (vLLM's names)")
    s.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS),
                   help="split <think>...</think> into the message's reasoning field")
    s.add_argument("--max-body-bytes", type=int, default=4 << 20,
                   help="the largest request body accepted, 413 above it "
                        "(default: 4 MiB)")
    s.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM "
                        "(default: 30)")
    s.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's and nanoserve's log level (default: info)")
    EngineConfig.add_cli_args(p)


def build_engine(config: EngineConfig, max_waiting: int | None = None):
    """The ``AsyncLLM`` the server runs: its own engine core, loaded from ``config``."""
    from nanoserve.async_engine import AsyncLLM

    return AsyncLLM(config, max_waiting=max_waiting)


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
    from nanoserve.entrypoints.openai.app import build_app
    from nanoserve.tp.worker import run_external, worker_rank

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:  %(message)s")
    for name, value, low in (("--max-body-bytes", args.max_body_bytes, 1),
                             ("--drain-timeout", args.drain_timeout, 0),
                             ("--max-waiting", args.max_waiting, 0)):
        if value is not None and value < low:
            print(f"nanoserve serve: error: {name} must be >= {low}, got {value}",
                  file=sys.stderr)
            return 2
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        print("nanoserve serve: error: --enable-auto-tool-choice needs --tool-call-parser "
              f"({', '.join(sorted(TOOL_PARSERS))})", file=sys.stderr)
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
        asked = EngineConfig.from_cli_args(args)
        log.info("non-default args: %s", ", ".join(f"{k}={v}" for k, v in
                                                    asked.non_default().items()) or "none")
        config = asked.for_serving()
        rank = worker_rank(config)
        if rank:  # torchrun's rank > 0: run rank 0's forwards; rank 0 alone listens
            log.info("tensor-parallel rank %d: serving rank 0's forwards", rank)
            forwards = run_external(config.device, config.distributed_timeout_s)
            log.info("tensor-parallel rank %d: rank 0 stopped after %d forwards", rank, forwards)
            return 0
        engine = build_engine(config, max_waiting=args.max_waiting)
    except ValueError as e:
        print(f"nanoserve serve: error: {e}", file=sys.stderr)
        return 2
    log.info("batching %s; token budget: %s tokens a step, chunked prefill %s, prefix caching %s",
             config.batching, config.max_num_batched_tokens or "max_model_len",
             "on" if config.enable_chunked_prefill else "off",
             "on" if config.enable_prefix_caching else "off")
    snap = engine.snapshot()
    if snap.decode_windows is not None:  # say which kind of window this is: a CPU has no capture
        log.info("decode windows: %s", snap.decode_windows)
    name = args.served_model_name or config.model.resolve().name
    app = build_app(engine, name, api_key=args.api_key, chat_template=template,
                    max_body_bytes=args.max_body_bytes,
                    enable_auto_tool_choice=args.enable_auto_tool_choice,
                    tool_call_parser=args.tool_call_parser,
                    reasoning_parser=args.reasoning_parser)
    server = make_server(app, engine, args.host, args.port, args.drain_timeout,
                         args.log_level)
    server.run()
    if not server.started:
        return 1
    snap = engine.snapshot()
    log.info("drained: %d of %d KV blocks free", snap.num_free_blocks, snap.num_blocks)
    return 0 if snap.num_free_blocks == snap.num_blocks else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="nanoserve serve")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
