"""The issue's acceptance path, as a user runs it: ``nanoserve quantize`` on the shipped model,
then ``nanoserve serve`` on what it wrote, answering the official ``openai`` client.

Both commands run as child processes on a free port of 127.0.0.1; the server is stopped by
SIGTERM and must exit cleanly. The chat answer must be the tokens the offline ``LLM`` gives on
the same folder (greedy, float32), so the server serves the quantized weights it loaded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import openai

from nanoserve import LLM, SamplingParams
from nanoserve.bench.local_server import free_port, wait_healthy

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
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "nanoserve.cli", "serve", "--model", str(out), "--host",
           "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-num-seqs", "2",
           "--max-model-len", "256"]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})

        def read() -> str:
            log.flush()
            log.seek(0)
            return log.read()

        try:
            wait_healthy(proc, url, 120, lambda: read()[-2000:], "nanoserve serve", 0.25)
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                   timeout=60)
            reply = client.chat.completions.create(model=out.name, messages=MESSAGES,
                                                   max_tokens=12, temperature=0,
                                                   extra_body={"ignore_eos": True})
            assert reply.usage.completion_tokens == 12
            assert reply.choices[0].message.content == want
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(timeout=15)
        text = read()
    assert code == 0, text[-2000:]
    assert "quantization: compressed-tensors w4a16, group 32, symmetric" in text
