"""A chat request's tools, checked and turned into a plan: which grammar, which parser.

Why this module exists: ``tools`` and ``tool_choice`` decide two things before any token is
generated, and both must be settled at the door. First, whether the request makes sense: a
choice that needs tools has them, a named function is among them, every ``parameters`` is a
JSON schema the grammar backend compiles, no two tools share a name, a forced call is not asked
for beside a second grammar, and ``"auto"`` is only taken by a server started to read the
model's own call format. Each refusal is a 400 naming ``tools`` or ``tool_choice`` (or the other
grammar's field). Second, how the output will be read, which ``ToolPlan`` holds:

- ``"none"``: the model answers in text (the template still sees the tools, as in vLLM);
- ``"auto"``: the model may call, in its trained format; ``--tool-call-parser`` reads it;
- ``"required"`` or a named function: a *forced* call. The grammar of
  ``nanoserve.structured.tools.forced_call_spec`` admits only calls valid against the schemas
  (strict: an object with no ``additionalProperties`` is closed), after the model's thinking
  when a reasoning parser is set; ``RequiredCallsParser`` / ``NamedCallParser`` read it back.
  This needs no ``--enable-auto-tool-choice``: the server, not the model, chose the format.

Rules follow vLLM's ``ChatCompletionRequest.check_tool_usage`` and ``OpenAIServingChat``, with
one difference: ``"required"`` with ``tools: []`` is a 400 here (vLLM quietly answers as
``"none"``), since a client that asked for a call and gave nothing to call has a bug.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nanoserve.entrypoints.openai.context import ServingContext
from nanoserve.entrypoints.openai.errors import ApiError
from nanoserve.entrypoints.openai.protocol import ChatCompletionRequest, NamedToolChoice
from nanoserve.entrypoints.openai.reasoning import reasoning_parser_class
from nanoserve.entrypoints.openai.tool_parsers import tool_parser_class
from nanoserve.entrypoints.openai.tool_parsers.base import ToolParser
from nanoserve.entrypoints.openai.tool_parsers.forced import NamedCallParser, RequiredCallsParser
from nanoserve.structured.params import StructuredOutputsParams
from nanoserve.structured.tools import forced_call_spec
from nanoserve.validation import InvalidRequest

AUTO_NEEDS_FLAGS = ('"auto" tool choice requires --enable-auto-tool-choice and '
                    '--tool-call-parser to be set')  # vLLM's words, so clients match on them


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools mean for its output.

    ``tools``: the function definitions as dicts (``{"name", "description", "parameters",
    ...}``), what the parsers and the grammar read; ``choice``: ``"none" | "auto" |
    "required" | "named"``; ``name``: the named function; ``parallel``: more than one call
    allowed; ``spec``: the forced call's grammar (``None`` unless forced); ``parser``: the
    ``--tool-call-parser`` name for ``"auto"``."""

    tools: tuple[dict, ...] = ()
    choice: str = "none"
    name: str | None = None
    parallel: bool = True
    spec: StructuredOutputsParams | None = None
    parser: str | None = None

    @property
    def forced(self) -> bool:
        return self.spec is not None

    def tool_parser(self) -> ToolParser | None:
        """A fresh parser for one choice (it holds a stream's state), or ``None`` for text."""
        tools = list(self.tools)
        if self.choice == "required":
            return RequiredCallsParser(tools)
        if self.choice == "named":
            return NamedCallParser(tools, self.name)
        if self.choice == "auto":
            return tool_parser_class(self.parser)(tools)
        return None


NO_TOOLS = ToolPlan()


def effective_choice(req: ChatCompletionRequest) -> tuple[str, str | None]:
    """``(choice, name)``: the request's ``tool_choice`` with OpenAI's default filled in
    (``"auto"`` when tools are given, else ``"none"``); a named choice is ``("named", name)``."""
    tc = req.tool_choice
    if isinstance(tc, NamedToolChoice):
        return "named", tc.function.name
    if tc is None:
        return ("auto" if req.tools else "none"), None
    return tc, None


def tool_dicts(req: ChatCompletionRequest) -> list[dict]:
    """Each tool's function definition as a dict, unset fields left out; two tools with one
    name are a 400 (a call could not say which it meant)."""
    out, seen = [], set()
    for k, t in enumerate(req.tools or []):
        f = t.function
        if f.name in seen:
            raise ApiError(400, f"tools[{k}]: the function name {f.name!r} is used by an "
                                f"earlier tool; names must be unique", "tools")
        seen.add(f.name)
        out.append(f.model_dump(exclude_none=True))
    return out


async def check_schema(ctx: ServingContext, k: int, tool: dict) -> None:
    """``tools[k]``'s ``parameters`` must be an object schema the grammar backend compiles
    strictly (the same compile a forced call's grammar will need); else a 400 on ``tools``.
    Compiled on a worker thread, as ``compile_grammar`` does, and cached by the backend."""
    params = tool.get("parameters")
    if params is None:
        return
    where = f"tools[{k}] ({tool['name']!r}): parameters"
    kind = params.get("type")
    if kind is not None and kind != "object":
        raise ApiError(400, f"{where} must be a JSON schema of type 'object', got "
                            f"type {kind!r}", "tools")
    try:
        spec = StructuredOutputsParams(json=params, strict=True)
        await asyncio.to_thread(ctx.engine.check_grammar, spec)
    except (InvalidRequest, ValueError) as e:  # the backend's words, less its field's name
        why = str(e).removeprefix("structured_outputs: ")
        raise ApiError(400, f"{where} is not a valid JSON schema: {why}", "tools") from None


def think_markers(ctx: ServingContext) -> tuple[str, str, bool] | None:
    """The reasoning parser's ``(start, end, implicit_start)``, which a forced call's grammar
    lets the model write its thinking between; ``None`` without ``--reasoning-parser``."""
    if ctx.reasoning_parser is None:
        return None
    cls = reasoning_parser_class(ctx.reasoning_parser)
    return cls.start, cls.end, cls.implicit_start


async def plan_tools(ctx: ServingContext, req: ChatCompletionRequest) -> ToolPlan:
    """The request's ``ToolPlan``, or the 400 that says what is wrong with its tools."""
    choice, name = effective_choice(req)
    tools = tool_dicts(req)
    if choice != "none" and not tools:
        raise ApiError(400, f"tool_choice {name or choice!r} needs tools: none were given",
                       "tool_choice")
    if choice == "named" and name not in {t["name"] for t in tools}:
        raise ApiError(400, f"tool_choice names the function {name!r}, which is not among "
                            f"the tools ({', '.join(t['name'] for t in tools)})", "tool_choice")
    if choice == "auto" and not (ctx.enable_auto_tool_choice and ctx.tool_call_parser):
        raise ApiError(400, AUTO_NEEDS_FLAGS, "tool_choice")
    forced = choice in ("required", "named")
    if forced:
        rf, so = req.response_format, req.structured_outputs
        other = ("structured_outputs" if so is not None else
                 "response_format" if rf is not None and rf.get("type") != "text" else None)
        if other is not None:
            raise ApiError(400, f"tool_choice {name or choice!r} is enforced with a grammar, "
                                f"so {other} (a second grammar) cannot be given too", other)
    for k, tool in enumerate(tools):
        await check_schema(ctx, k, tool)
    if not forced:
        return ToolPlan(tuple(tools), choice, None, req.parallel_tool_calls, None,
                        ctx.tool_call_parser if choice == "auto" else None)
    spec = forced_call_spec(tools, name if choice == "named" else "required",
                            req.parallel_tool_calls, think_markers(ctx))
    try:  # the whole call's grammar; cached, so compile_grammar finds it ready
        await asyncio.to_thread(ctx.engine.check_grammar, spec)
    except (InvalidRequest, ValueError) as e:
        raise ApiError(400, f"the tools do not make a grammar: {e}", "tools") from None
    return ToolPlan(tuple(tools), choice, name, req.parallel_tool_calls, spec, None)
