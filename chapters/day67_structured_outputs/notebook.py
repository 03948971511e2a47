# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 67 notebook: a grammar as a mask over the vocabulary
#
# A request that carries a JSON schema, a regex or a list of choices gets, before every token,
# the set of ids its grammar allows; the sampler sets the rest to `-inf`. In well under a
# minute on a CPU:
#
# 1. three specs and the grammar text llguidance compiles them to;
# 2. the tokens allowed after `{`, compact and with any whitespace, and where the shipped
#    model's probability goes among them;
# 3. the shipped model generating with a schema, a regex and a choice, beside a free row;
# 4. a bad spec refused before any forward.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import json

from chapters.day67_structured_outputs.claims import PROMPT, SCHEMA, after_brace, llm
from chapters.day67_structured_outputs.snapshot import mask as frozen
from nanoserve import SamplingParams
from nanoserve.structured.params import StructuredOutputsParams as Spec
from nanoserve.validation import InvalidRequest

# %% [markdown]
# ## 1. A spec and its grammar
#
# `StructuredOutputsParams` takes exactly one kind. `lark()` is what the backend compiles,
# llguidance's grammar text: a schema travels inside it whole (the library writes its rules
# when it compiles), a regex is a one-rule grammar, and a choice the regex of its
# alternatives, each escaped.

# %%
specs = {"schema": Spec(json=SCHEMA), "regex": Spec(regex=r"[0-9]{3}-[a-z]{2,4}"),
         "choice": Spec(choice=["yes", "no", "maybe"])}
for name, spec in specs.items():
    print(f"--- {name}: kind={spec.kind}, key={spec.key[:60]!r}")
    print(spec.lark().strip()[:600])
print("the choice as a regex (frozen rewrite):", frozen.choice_regex(["yes", "no", "maybe"]))

# %% [markdown]
# ## 2. After `{`: compact against any whitespace
#
# The claim's measurement: feed the prompt and `{` to the shipped model, advance the matcher
# by `{`, fill the bitmask and read which ids it allows and how much of the model's
# probability they hold.

# %%
print(f"prompt {PROMPT!r}, schema {json.dumps(SCHEMA)}")
for any_ws in (False, True):
    r = after_brace(any_ws)
    label = "any whitespace" if any_ws else "compact"
    print(f"{label:>14}: {r['allowed']} allowed, {r['space']} of them whitespace; "
          f"whitespace holds {r['space_mass']:.1%} of the allowed probability; "
          f"likeliest allowed: {r['top']!r}")

# %% [markdown]
# The mask itself: one int32 word per 32 ids, one row per constrained request. Here is the
# compact grammar's row after `{`, unpacked by the frozen snapshot.

# %%
from nanoserve.structured.mask import fill  # noqa: E402

tok = llm().tokenizer
m = llm().core.grammars().matcher(Spec(json=SCHEMA))
m.consume_tokens(tok.encode("{", add_special_tokens=False))
V = llm().core.vocab_size
words = fill([m], V)
ok = frozen.unpack(words, V)[0]
print(f"bitmask shape {tuple(words.shape)} for V={V}; allowed ids:",
      [(i, tok.decode([i])) for i in ok.nonzero().flatten().tolist()])

# %% [markdown]
# ## 3. Generating under a grammar
#
# One batch: a schema, a regex, a choice and a free row. Each constrained completion ends with
# `stop` when its grammar is complete.

# %%
prompts = ["A person as JSON:", "Code:", "Answer:", "The while statement"]
params = [SamplingParams(max_tokens=64, temperature=0, structured_outputs=s)
          for s in specs.values()] + [SamplingParams(max_tokens=24, temperature=0)]
for p, o in zip(prompts, llm().generate(prompts, params), strict=True):
    print(f"{p!r:>24} -> {o.text!r} ({o.finish_reason}, {len(o.token_ids)} tokens)")

# %% [markdown]
# ## 4. A refusal
#
# A bad spec fails when the backend compiles it, before any forward pass, as an
# `InvalidRequest` naming `structured_outputs` (the server turns it into a 400).

# %%
before = llm().engine.forward_passes
try:
    llm().generate(["x"], SamplingParams(structured_outputs=Spec(json={"type": "nonsense"})))
except InvalidRequest as e:
    print(f"refused: param={e.param!r}: {str(e)[:120]}")
print("forward passes spent on it:", llm().engine.forward_passes - before)
