# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 80 notebook: parsing a stream you did not generate
#
# With `tool_choice: "auto"` the model writes its calls in its own format and the server reads
# them as the text streams in. This notebook shows what a stream must hold back, reads one
# response in each format, cuts a Hermes call inside its marker, breaks a call after its name
# in the server's default mode and in vLLM's early one, and splits a thinking model's `<think>`
# block two ways. It runs in seconds on a CPU.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

from chapters.day80_parsing_streams import claims, corpus, streams
from chapters.day80_parsing_streams.snapshot import hermes, holdback, think
from nanoserve.entrypoints.openai.reasoning import reasoning_parser_class
from nanoserve.entrypoints.openai.tool_parsers import tool_parser_class

# %% [markdown]
# ## 1. Holding back
#
# A stream may not send a tail that could still grow into the marker, and need not hold
# anything more: the longest tail that is a proper prefix of the marker.

# %%
for text in ["Yes: <tool", "Yes: <tool_call", "a < b", "see [TOOL_CALLS"]:
    marker = "[TOOL_CALLS]" if "[" in text else "<tool_call>"
    now, wait = holdback.split_safe(text, marker)
    print(f"{text!r:20} -> send {now!r:12} hold {wait!r}")

# %% [markdown]
# ## 2. One response in each format, read whole
#
# The same two tools for every format; each parser returns the calls (id, name, the arguments
# as the model wrote them) and the content.

# %%
examples = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris"}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                   '{"name": "search", "parameters": {"query": "Paris"}}',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
}
for fmt, text in examples.items():
    e = tool_parser_class(fmt)(corpus.TOOLS).extract(text)
    print(fmt)
    for c in e.calls:
        print(f"   call id={c.id} name={c.name} arguments={c.arguments}")
    print(f"   content={e.content!r}")

# %% [markdown]
# ## 3. A stream cut inside the marker
#
# The first delta ends in `<tool`. The parser sends the text before it and holds the rest;
# the next delta completes the marker. In the server's default mode the call goes out, name
# and arguments together, once its object has closed and been judged; with `early=True`
# (vLLM's way) its first delta goes out once the name is known and the arguments have opened,
# and the arguments follow as they arrive.

# %%
text = examples["hermes"]
cut = text.index("<tool_call>") + len("<tool")
for early in (False, True):
    print(f"early={early}")
    p = tool_parser_class("hermes")(corpus.TOOLS, early=early)
    for piece in (text[:cut], text[cut:cut + 30], text[cut + 30:cut + 45], text[cut + 45:], None):
        d = p.feed(piece) if piece is not None else p.finish()
        label = "finish" if piece is None else repr(piece)
        calls = [(c.index, c.name, c.arguments) for c in d.calls]
        print(f"   {label:36} content={d.content!r} calls={calls}")

# %% [markdown]
# ## 4. Every cut
#
# The harness streams one response split at every position and one character at a time, reads
# each stream back as a client would and compares it with the whole reading.

# %%
reader = streams.PackageTools("hermes", corpus.TOOLS)
whole, _ = reader.whole(text)
runs = [reader.stream(pieces) for pieces in streams.cuts(text)]
print("streams:", len(runs), " differing from the whole reading:",
      sum(r.reading != whole for r in runs), " shape violations:",
      sum(r.violations for r in runs))
for early in claims.MODES:
    print(f"early={early}")
    for fmt in claims.FORMATS:
        print(f"   {fmt:12} valid streams differing: {claims.differ(fmt, 'valid', early):>10}   "
              f"malformed streams differing: {claims.differ(fmt, 'malformed', early)}")

# %% [markdown]
# ## 5. A call that breaks after its name
#
# The whole reading judges the object once it has closed, and makes it all content. The
# default stream waits for the same judgement and agrees. An early stream has sent the call by
# the time the stray comma arrives, and cannot take it back. The snapshot, with the same
# switch, does the same in each mode.

# %%
broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris",}}\n</tool_call>'
print("whole        :", reader.whole(broken)[0])
print("stream       :", reader.stream(list(broken)).reading)
early_reader = streams.PackageTools("hermes", corpus.TOOLS, early=True)
print("stream, early:", early_reader.stream(list(broken)).reading)
for early in (False, True):
    snap = streams.SnapshotHermes(corpus.NAMES, early=early)
    print(f"snapshot early={early}: stream {snap.stream(list(broken)).reading}")
print("whole, snapshot:", hermes.extract(broken, corpus.NAMES))

# %% [markdown]
# ## 6. Thinking, two ways
#
# Qwen3 thinks only when the response opens with `<think>`; DeepSeek-R1 starts inside the
# thinking because its template wrote the marker. The same texts, split by both parsers and by
# the snapshot's splitter; then one stream cut inside `</think>`.

# %%
for case in corpus.REASONING[:4]:
    print(case.label)
    for name, implicit in claims.IMPLICIT.items():
        got = reasoning_parser_class(name)().split(case.text)
        assert got == think.split(case.text, implicit)
        print(f"   {name:12} reasoning={got[0]!r} content={got[1]!r}")

text = corpus.REASONING[0].text
cut = text.index("</think>") + 4
p = reasoning_parser_class("deepseek_r1")()
for piece in (text[:cut], text[cut:]):
    d = p.feed(piece)
    print(f"feed {piece[-12:]!r:16} reasoning={d.reasoning!r} content={d.content!r} "
          f"ended={p.ended}")
