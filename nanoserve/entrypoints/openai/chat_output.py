"""One chat choice's text read into OpenAI's message: thinking, answer and tool calls.

Why this module exists: what the model wrote is not yet what the client reads. With
``--reasoning-parser`` the text first splits into thinking (``reasoning``, and the same text as
``reasoning_content``) and the answer; only the answer, after the thinking has ended, goes to the
tool parser of the request's ``ToolPlan`` (the ``--tool-call-parser`` under ``"auto"``, the forced
call's reader under ``"required"`` or a named function), which separates calls from text. The
pipeline runs twice over, whole (``message``) and streamed (``ChoiceOutput.delta`` per engine
delta), and the two must agree: a stream's reasoning, content and each call's name and argument
fragments, joined, equal the whole response's (call ids aside, which are drawn fresh).

OpenAI's rules on top: ``content`` is null when the model called a tool and wrote nothing
else; ``finish_reason`` is ``"tool_calls"`` when the choice made calls and stopped on its own
(``"length"`` stays ``"length"``: a call cut short is not a call, and its text is content);
with ``parallel_tool_calls: false`` only the first call is kept (vLLM's filter). A stream's
first piece of a call carries its index, id, ``type: "function"``, the name and empty
arguments; later pieces the index and argument fragments.

    text ─► ReasoningParser ─► reasoning ─────────────────────────► reasoning(_content)
                           └─► answer ─► ToolParser ─► content ───► content
                                                   └─► calls ─────► tool_calls
"""

from __future__ import annotations

from nanoserve.entrypoints.openai.protocol import (
    AssistantMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from nanoserve.entrypoints.openai.reasoning import reasoning_parser_class
from nanoserve.entrypoints.openai.tool_parsers.base import CallDelta
from nanoserve.entrypoints.openai.tools import ToolPlan


def finish_reason(reason: str | None, called: bool) -> str | None:
    """The engine's reason, as OpenAI says it when the choice made calls."""
    return "tool_calls" if called and reason == "stop" else reason


class ChoiceOutput:
    """The reading of one choice: build it per choice, then ``message(text)`` for a whole
    response or ``delta(text, finished)`` per engine delta for a stream (never both: the
    parsers keep a stream's state)."""

    def __init__(self, plan: ToolPlan, reasoning_parser: str | None):
        self.plan = plan
        self.reasoning = reasoning_parser_class(reasoning_parser)() if reasoning_parser \
            else None
        self.tools = plan.tool_parser()
        self.called = False  # the choice made a call (a stream: released a call's first piece)

    # ------------------------------------------------------------------ whole

    def message(self, text: str) -> AssistantMessage:
        reasoning, content = (self.reasoning.split(text) if self.reasoning is not None
                              else (None, text))
        calls = []
        if self.tools is not None and content:
            got = self.tools.extract(content)
            content = got.content or None
            calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
                     for c in got.calls]
            if not self.plan.parallel:
                calls = calls[:1]
        self.called = bool(calls)
        return AssistantMessage(content=content, reasoning=reasoning,
                                reasoning_content=reasoning, tool_calls=calls)

    # ------------------------------------------------------------------ streamed

    def delta(self, text: str, finished: bool) -> list[DeltaMessage]:
        """The deltas one engine delta releases, in order (possibly none: a parser may hold
        back a partial marker). On the last engine delta the parsers are flushed too."""
        reasoning, answer = "", text
        if self.reasoning is not None:
            rd = self.reasoning.feed(text)
            if finished:
                end = self.reasoning.finish()
                rd.reasoning += end.reasoning
                rd.content += end.content
            reasoning, answer = rd.reasoning, rd.content
        content, calls = answer, []
        if self.tools is not None:
            sd = self.tools.feed(answer) if answer else None
            content, calls = (sd.content, list(sd.calls)) if sd is not None else ("", [])
            if finished:
                end = self.tools.finish()
                content += end.content
                calls += end.calls
        out = []
        if reasoning:
            out.append(DeltaMessage(reasoning=reasoning, reasoning_content=reasoning))
        if content:
            out.append(DeltaMessage(content=content))
        out += [DeltaMessage(tool_calls=[self.call_delta(c)]) for c in calls
                if self.plan.parallel or c.index == 0]
        return out

    def call_delta(self, c: CallDelta) -> DeltaToolCall:
        """OpenAI's shape of one piece: the first (it has the name) opens the call."""
        if c.name is not None:
            self.called = True
            return DeltaToolCall(index=c.index, id=c.id, type="function",
                                 function=DeltaFunctionCall(name=c.name, arguments=c.arguments))
        return DeltaToolCall(index=c.index, function=DeltaFunctionCall(arguments=c.arguments))
