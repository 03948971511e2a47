"""Each family end to end: ``nanoserve generate`` and the server on a random checkpoint written by
transformers, with a tokenizer the test writes (``nanoserve.testing.write_tokenizer``: its
vocabulary is the checkpoint's 256 ids) and the family's chat template (``CHAT_TEMPLATES``).

The families are those ``write_hf_checkpoint`` writes (``testing.FAMILIES``) that nanoserve's
registry serves; a variant (``gemma3-vision``) takes its family's format (the name before the
dash), and one with no chat format in ``CHAT_TEMPLATES`` is skipped by name.

- ``nanoserve generate --model <folder> --chat`` runs as a child process for every family.
- The server: ``nanoserve serve`` as a child process on a free 127.0.0.1 port for one family
  (Llama, whose template also calls ``strftime_now``; its ``generation_config.json`` carries
  sampling defaults, so the startup log and the defaults are checked there), and the same app
  (``build_app`` over ``AsyncLLM``, real uvicorn on a free port, ``server_fixture.py``) in this
  process for the others: a child server per family would cost a torch import and a load each,
  and the app, the routes and the template path are the same code.
- The rendered prompt is read back through ``return_token_ids`` (the response's
  ``prompt_token_ids``) and compared with the family's published layout, written out here by
  hand (not by the template under test).
- A family's rule (Mistral: no system message; roles alternate) is a 400 with the template's
  own words; a template that does not parse is a 400 naming its line; neither is a 500.
- ``generation_config.json``'s defaults apply to a request that leaves a field unset and yield
  to one that sets it, in the server, ``LLM`` and ``nanoserve generate``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from datetime import datetime

import httpx
import openai
import pytest
from server_fixture import ServerThread, error_of

from nanoserve import testing
from nanoserve.async_engine import AsyncLLM
from nanoserve.entrypoints.openai.app import build_app
from nanoserve.model.registry import MODEL_FAMILIES
from nanoserve.tokenizer import Tokenizer

SERVED = [f for f in testing.FAMILIES if testing.FAMILIES[f][1] in MODEL_FAMILIES]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
USER_ONLY = CHAT[1:]
ENGINE = dict(dtype="float32", max_num_seqs=2, max_model_len=128)
FLAGS = ["--dtype", "float32", "--max-num-seqs", "2", "--max-model-len", "128"]
GEN_DEFAULTS = {"temperature": 0.0, "max_new_tokens": 3, "do_sample": False}


def chat_format(family: str) -> str:
    """The family whose chat format ``family`` speaks: a variant speaks its family's."""
    return family if family in testing.CHAT_TEMPLATES else family.split("-")[0]


def expected(family: str) -> tuple[list[dict], str]:
    """The messages sent to ``family`` and the prompt its published layout makes of them."""
    today = datetime.now().strftime("%d %b %Y")
    chatml = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n")
    return {
        "llama": (CHAT, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                        f"Cutting Knowledge Date: December 2023\nToday Date: {today}\n\n"
                        "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
                        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        "qwen2": (CHAT, chatml),
        "qwen3": (CHAT, chatml),
        "mistral": (USER_ONLY, "<s>[INST] Hi [/INST]"),
        "gemma3": (CHAT, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                         "<start_of_turn>model\n"),
        "phi3": (CHAT, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"),
    }[chat_format(family)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(family) -> a random checkpoint with the test's tokenizer and template; the
    Llama one also carries generation_config.json sampling defaults."""
    cache = {}

    def make(family: str):
        if chat_format(family) not in testing.CHAT_TEMPLATES:
            pytest.skip(f"{family}: no chat format in nanoserve.testing.CHAT_TEMPLATES")
        if family not in cache:
            folder = testing.write_hf_checkpoint(tmp_path_factory.mktemp(family),
                                                 family=family)
            testing.write_tokenizer(folder, chat_format(family))
            if family == "llama":
                gen = folder / "generation_config.json"
                gen.write_text(json.dumps({**json.loads(gen.read_text()), **GEN_DEFAULTS}))
            cache[family] = folder
        return cache[family]

    return make


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def check_rendered(url: str, folder, family: str) -> None:
    """One chat completion; the prompt the engine ran is the family's layout, token for token
    (each special token one id)."""
    messages, want = expected(family)
    out = client(url).chat.completions.create(
        model=folder.name, messages=messages, max_tokens=2, temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True})
    tok = Tokenizer.from_dir(folder)
    assert tok.decode(out.prompt_token_ids, skip_special_tokens=False) == want
    assert out.prompt_token_ids == tok.encode(want, add_special_tokens=False)
    assert out.usage.prompt_tokens == len(out.prompt_token_ids)
    assert out.usage.completion_tokens == 2 and out.choices[0].finish_reason == "length"


@pytest.mark.parametrize("family", [f if f == "llama" else pytest.param(f, marks=pytest.mark.slow)
                                    for f in SERVED])  # make test keeps one; test-all runs all
def test_nanoserve_generate_runs_each_family(checkpoint, family):
    """Llama's generation_config.json says max_new_tokens=3: unset, its budget is that."""
    folder = checkpoint(family)
    budget = [] if family == "llama" else ["--max-tokens", "4"]
    r = subprocess.run([sys.executable, "-m", "nanoserve.cli", "generate", "Hi", "--chat",
                        "--model", str(folder), "--ignore-eos", *budget, *FLAGS],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    n_prompt = len(Tokenizer.from_dir(folder).apply_chat_template(USER_ONLY, tokenize=True))
    n = 3 if family == "llama" else 4
    assert f"[{n_prompt} prompt + {n} generated tokens, finish_reason=length" in r.stderr


@pytest.mark.parametrize("family", [f for f in SERVED if f != "llama"])
def test_the_server_renders_each_familys_template(checkpoint, family):
    folder = checkpoint(family)
    engine = AsyncLLM.from_options(folder, **ENGINE)
    with ServerThread(build_app(engine, folder.name)) as s:
        check_rendered(s.url, folder, family)
    snap = engine.snapshot()
    assert snap.num_free_blocks == snap.num_blocks


def test_nanoserve_serve_renders_llama_and_applies_its_generation_config(checkpoint):
    """The CLI server: Llama's template (with today's date) and the checkpoint's sampling
    defaults, logged at startup, applied to unset fields and overridden by set ones."""
    from nanoserve.bench.local_server import free_port, wait_healthy

    folder = checkpoint("llama")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "nanoserve.cli", "serve", "--model", str(folder), "--host",
           "127.0.0.1", "--port", str(port), *FLAGS]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})

        def read() -> str:
            log.flush()
            log.seek(0)
            return log.read()

        try:
            wait_healthy(proc, url, 120, lambda: read()[-2000:], "nanoserve serve", 0.25)
            check_rendered(url, folder, "llama")
            c = client(url)
            unset = c.chat.completions.create(model=folder.name, messages=USER_ONLY,
                                              extra_body={"ignore_eos": True})
            assert unset.usage.completion_tokens == 3  # max_new_tokens
            greedy = c.chat.completions.create(model=folder.name, messages=USER_ONLY,
                                               max_tokens=3, temperature=0,
                                               extra_body={"ignore_eos": True})
            assert unset.choices[0].message.content == greedy.choices[0].message.content
            set_ = c.completions.create(model=folder.name, prompt="Hi", max_tokens=5,
                                        extra_body={"ignore_eos": True})
            assert set_.usage.completion_tokens == 5  # the request's own value wins
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(timeout=15)
        text = read()
    assert code == 0, text[-2000:]
    line = next(ln for ln in text.splitlines() if "generation_config=auto:" in ln)
    assert "temperature=0.0, max_tokens=3" in line and "ignored: do_sample" in line


def test_generation_config_in_llm_and_generate(checkpoint, tmp_path):
    from nanoserve.llm import LLM

    folder = checkpoint("llama")
    llm = LLM(folder, **ENGINE)
    sp = llm.get_default_sampling_params()
    assert (sp.temperature, sp.max_tokens) == (0.0, 3)
    out = llm.generate(["Hi"])[0]  # no params: the defaults
    assert len(out.token_ids) <= 3
    assert LLM(folder, generation_config="vllm", **ENGINE).get_default_sampling_params() \
        .temperature == 1.0  # vllm: the file is ignored
    elsewhere = tmp_path / "gen"
    elsewhere.mkdir()
    (elsewhere / "generation_config.json").write_text(json.dumps({"top_k": 7}))
    assert LLM(folder, generation_config=str(elsewhere), **ENGINE).generation_defaults == \
        {"top_k": 7}
    (elsewhere / "generation_config.json").write_text(json.dumps({"top_p": 0}))
    with pytest.raises(ValueError, match=r"generation_config\.json: top_p must be in"):
        LLM(folder, generation_config=str(elsewhere), **ENGINE)
    with pytest.raises(ValueError, match="generation_config='nowhere'"):
        LLM(folder, generation_config="nowhere", **ENGINE)
    r = subprocess.run([sys.executable, "-m", "nanoserve.cli", "generate", "Hi", "--model",
                        str(folder), "--ignore-eos", "--max-tokens", "2", *FLAGS],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "+ 2 generated tokens" in r.stderr, r.stderr[-2000:]  # flag wins


def test_template_refusals_are_400s_in_the_templates_words(checkpoint):
    family = "mistral" if "mistral" in SERVED else pytest.skip("no mistral family")
    folder = checkpoint(family)
    engine = AsyncLLM.from_options(folder, **ENGINE)
    with ServerThread(build_app(engine, folder.name)) as s:
        c = client(s.url)
        for messages, words in ((CHAT, "the system role is not supported"),
                                ([USER_ONLY[0], USER_ONLY[0]], "roles must alternate")):
            with pytest.raises(openai.BadRequestError) as e:
                c.chat.completions.create(model=folder.name, messages=messages, max_tokens=2)
            assert words in e.value.message and e.value.param == "messages"
    bad = "{% for m in messages %}{{ m['content'] }{% endfor %}"
    other = AsyncLLM.from_options(folder, **ENGINE)
    with ServerThread(build_app(other, "broken", chat_template=bad)) as broken:
        r = httpx.post(broken.url + "/v1/chat/completions", timeout=60,
                       json={"messages": USER_ONLY, "max_tokens": 2})
        err = error_of(r, 400)
        assert "does not parse: line 1" in err["message"] and err["param"] == "messages"
    for e in (engine, other):
        snap = e.snapshot()
        assert snap.num_free_blocks == snap.num_blocks
