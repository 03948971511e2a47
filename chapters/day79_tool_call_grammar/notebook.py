# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 79 notebook: a tool call is a grammar
#
# A client that demands a call (`tool_choice: "required"` or a named function) gets one
# because the server turns the tools into a JSON schema and masks the model to it. This
# notebook builds those schemas for two of the chapter's tools, walks the mask through a call
# token by token, forces a named and a required call on the shipped model, and reads both back
# the way the server does, whole and as a stream. It runs in seconds on a CPU.

# %%
import json
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.day79_tool_call_grammar import claims
from chapters.day79_tool_call_grammar.snapshot import forced

tools = claims.TOOLS[:2]  # get_weather and add
print(json.dumps(forced.forced_call_schema(tools, "required", parallel_tool_calls=False),
                 indent=1))

# %% [markdown]
# ## 1. The named choice is the parameters schema, closed
#
# `strict` compilation adds `additionalProperties: false` to every object that has
# `properties` and says nothing about extra keys.

# %%
print(forced.forced_call_schema(tools, claims.named("add")))
print(claims.spec(claims.named("add")).schema() ==
      forced.forced_call_schema(tools, claims.named("add")))

# %% [markdown]
# ## 2. What the mask allows along the way
#
# The tokens allowed after a few prefixes of a required call: the opening bracket, the name
# (a switch over the tool names), the closing brace of a closed object, and the end of the
# array when one call is allowed.

# %%
for prefix in ["", '[{"name":"', '[{"name":"get_weather","parameters":{"city":"Paris","unit":"C"',
               '[{"name":"get_time","parameters":{}}']:
    ok = claims.allowed_after(claims.spec("required", parallel=False), prefix)
    shown = ok if len(ok) <= 16 else f"{len(ok)} tokens"
    print(f"after {prefix!r:70} {shown}")

# %% [markdown]
# ## 3. Forcing a call on the shipped model
#
# One question, greedy, under a named choice and under `"required"`. The model has never seen
# a tool; the grammar writes the structure, the model fills the strings and numbers.

# %%
from nanoserve import SamplingParams  # noqa: E402

question = claims.QUESTIONS[1]  # "What is 2 plus 3?"
ids = claims.prompt(question, claims.half(1))
print(f"{len(ids)} prompt tokens with the first four tools rendered")
texts = {}
for choice in (claims.named("add"), "required"):
    grammar = claims.spec(choice, parallel=False, tools=claims.half(1))
    sp = SamplingParams(max_tokens=claims.MAX_TOKENS, temperature=0, structured_outputs=grammar)
    out = claims.llm().generate([ids], sp)[0]
    texts[json.dumps(choice)] = (choice, out)
    print(f"{json.dumps(choice):55} {out.finish_reason:6} {out.text}")

# %% [markdown]
# ## 4. Reading the calls back
#
# The package's parsers: the whole text at once, then the same text fed one token at a time,
# as a stream would deliver it. The streamed argument fragments join to the whole
# response's arguments.

# %%
tok = claims.llm().tokenizer
for choice, out in texts.values():
    whole = claims.parser(choice).extract(out.text)
    print("whole:", [(c.name, c.arguments) for c in whole.calls], "content:", whole.content)
    p, sent = claims.parser(choice), ""
    for i in range(1, len(out.token_ids) + 1):
        text = tok.decode(out.token_ids[:i])
        for d in p.feed(text[len(sent):]).calls:
            print("   delta", d)
        sent = text
    print("   finish", p.finish())
