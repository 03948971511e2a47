"""``ServingContext``: what every route of one app reads, gathered once when the app is built.

Why this module exists: the routes live in one file per endpoint family (``completions.py``,
``chat.py``, ``tokenization.py``), as module-level routers that any number of apps can include.
What differs between two apps, the engine, the name clients send as ``model``, the tokenizer
(with this app's ``--chat-template``), the metrics registry, the limits, is one frozen object
stored on the app as ``app.state.serving``; a route finds its own with ``serving(request)``.
Only ``state`` (the app's ``ready`` and ``draining`` flags) changes while the app runs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from fastapi import Request

from nanoserve.entrypoints.openai.logprobs import Render
from nanoserve.entrypoints.openai.metrics import ServerMetrics


@dataclass(frozen=True, slots=True)
class ServingContext:
    engine: object  # the AsyncLLM
    served_model_name: str
    tokenizer: object | None  # None: the engine was loaded without one (token ids only)
    render: Render
    metrics: ServerMetrics
    max_model_len: int
    vocab_size: int
    max_body_bytes: int
    api_key: str | None
    state: object  # the app's starlette State: ready, draining, drain_timeout
    # generation_config.json's sampling defaults, by SamplingParams' names: a request's unset
    # field takes them (vLLM's --generation-config auto)
    sampling_defaults: dict
    # Day 79-80: tool calling and reasoning (serve's --enable-auto-tool-choice,
    # --tool-call-parser and --reasoning-parser; names from the registries)
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    @classmethod
    def build(cls, engine, served_model_name: str, state, api_key: str | None = None,
              chat_template: str | None = None, max_body_bytes: int = 4 << 20,
              enable_auto_tool_choice: bool = False, tool_call_parser: str | None = None,
              reasoning_parser: str | None = None) -> ServingContext:
        tokenizer = engine.tokenizer
        if tokenizer is not None and chat_template is not None:
            tokenizer = copy.copy(tokenizer)  # the override applies to this app only
            tokenizer.chat_template = chat_template
        return cls(engine=engine, served_model_name=served_model_name, tokenizer=tokenizer,
                   render=Render(tokenizer), metrics=ServerMetrics(engine, served_model_name),
                   max_model_len=engine.max_model_len, vocab_size=engine.vocab_size,
                   max_body_bytes=max_body_bytes, api_key=api_key, state=state,
                   sampling_defaults=dict(getattr(engine, "generation_defaults", {})),
                   enable_auto_tool_choice=enable_auto_tool_choice,
                   tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser)


def serving(request: Request) -> ServingContext:
    """The context of the app that received ``request``."""
    return request.app.state.serving
