"""Forced tool calls on a random checkpoint of each family, through its own chat format.

Why this file exists: a forced call is a grammar over the tokenizer's vocabulary, so it must
hold whatever the model and its tokenizer are. Each family (Llama, Qwen2, Qwen3, Mistral,
Phi-3, Gemma 3) gets a random checkpoint written by transformers (``nanoserve.testing``) with a
character-level tokenizer and the family's chat template, served by a real server; every tool
of ``tool_schemas.TOOLS`` is forced with ``tool_choice: "required"`` (one call) and its
arguments validate with ``jsonschema``; one call per family is also streamed, and the stream
joined equals the whole response. A random model writes whatever the grammar allows, which is
the point: validity must come from the grammar, not from the model's good sense.

The checkpoints' context is raised to 4096 positions (``BASE`` has 128): the templates write
the tool's schema into the prompt, up to about two thousand characters (Llama's), one token
each. And the tokenizer's decoder is said the way SentencePiece checkpoints say it
(``Replace("▁", " ")``, ``ByteFallback``, ``Fuse``) instead of a lone ``Fuse``: the grammar
library reads each token's bytes from the decoder and does not know a lone ``Fuse`` ("can't
determine decoder type"). For this vocabulary (no ``▁``, no ``<0xNN>`` tokens) the two decode
every id sequence to the same text.
"""

from __future__ import annotations

import json

import openai
import pytest
from server_fixture import ServerThread
from tool_schemas import MESSAGES, NAMES, TOOLS, joined, valid, whole

from nanoserve.async_engine import AsyncLLM
from nanoserve.entrypoints.openai.app import build_app
from nanoserve.testing import write_hf_checkpoint, write_tokenizer

FAMILIES = {"llama": "gqa", "qwen2": "gqa", "qwen3": "head_dim", "mistral": "gqa",
            "phi3": "phi3", "gemma3": "gemma3"}  # family -> its testing.CONFIGS/VARIANTS shape
SENTENCEPIECE_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}]}
GREEDY = dict(temperature=0, max_completion_tokens=256, parallel_tool_calls=False)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_server(request, tmp_path_factory):
    family = request.param
    folder = write_hf_checkpoint(tmp_path_factory.mktemp(family), FAMILIES[family],
                                 family=family, max_position_embeddings=4096)
    write_tokenizer(folder, family)
    spec = json.loads((folder / "tokenizer.json").read_text())
    assert spec["decoder"] == {"type": "Fuse"}, spec["decoder"]  # what the docstring says
    spec["decoder"] = SENTENCEPIECE_DECODER
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    engine = AsyncLLM.from_options(folder, dtype="float32")
    with ServerThread(build_app(engine, family)) as s:
        s.family, s.engine = family, engine
        s.client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0,
                                 timeout=60)
        yield s
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks


def forced(server, tool: str, **kw):
    return server.client.chat.completions.create(
        model=server.family, messages=MESSAGES, tool_choice="required",
        tools=[t for t in TOOLS if t["function"]["name"] == tool], **GREEDY, **kw)


def test_every_tool_forced_on_the_family_validates(family_server):
    bad = {}
    for tool in NAMES:
        got = whole(forced(family_server, tool).choices[0])
        ok = (got["finish_reason"] == "tool_calls" and got["content"] is None
              and len(got["calls"]) == 1 and got["calls"][0][0] == tool
              and valid(tool, got["calls"][0][1]))
        if not ok:
            bad[tool] = got
    assert not bad, f"{family_server.family}: {len(NAMES) - len(bad)}/{len(NAMES)} valid: {bad}"


def test_a_streamed_forced_call_joins_to_the_whole(family_server):
    tool = NAMES[list(FAMILIES).index(family_server.family) % len(NAMES)]  # one each, spread
    got = whole(forced(family_server, tool).choices[0])
    assert joined(forced(family_server, tool, stream=True)) == got
    assert got["calls"][0][0] == tool and valid(tool, got["calls"][0][1])
