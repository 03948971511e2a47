"""The issue's acceptance path, as a user runs it: ``nanoserve quantize`` on the shipped model,
then ``nanoserve serve`` on what it wrote, answering the official ``openai`` client.

Both commands run as child processes on a free port of 127.0.0.1; the server is stopped by
SIGTERM and must exit cleanly. The chat answer must be the tokens the offline ``LLM`` gives on
the same folder (greedy, float32), so the server serves the quantized weights it loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai

from nanoserve import LLM, SamplingParams
from nanoserve.bench.local_server import local_server

SHIPPED = Path(__file__).resolve().parents[1] / "nanoserve" / "checkpoints" / "nanoserve-tiny"
MESSAGES = [{"role": "user", "content": "What does the with statement do?"}]


def test_quantize_then_serve_answers_the_openai_client(tmp_path):
    out = tmp_path / "tiny-w4a16-g32"
    made = subprocess.run([sys.executable, "-m", "nanoserve.cli", "quantize", str(SHIPPED),
                           str(out), "--scheme", "w4a16", "--group-size", "32"],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    llm = LLM(str(out), dtype="float32")
    prompt = llm.core.loaded.tokenizer.apply_chat_template(MESSAGES, tokenize=True)
    want = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12,
                                                 ignore_eos=True))[0].text
    with local_server(out, dtype="float32", max_num_seqs=2, timeout_s=120,
                      extra_args=("--max-model-len", "256")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                               timeout=60)
        reply = client.chat.completions.create(model=out.name, messages=MESSAGES, max_tokens=12,
                                               temperature=0, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 12
        assert reply.choices[0].message.content == want
        text = server.log()
    assert server.process.returncode == 0, text[-2000:]
    assert "quantization: compressed-tensors w4a16, group 32, symmetric" in text
