"""The engine on GPTQ and AWQ checkpoints: what each format's reader says the weights are is what
the engine serves.

The checkpoints come from the fixture writers (``nanoserve.quantization.fixtures``, written from
each format's published description apart from the readers), so this file does not prove that
AutoGPTQ's or AutoAWQ's own files read right; the readers' tests say what the round trip does
prove. What it adds: loading such a folder (fused q/k/v and gate/up built from three and two
quantized parts, act order's gathered inputs, float16 scales) gives the same greedy tokens and
logits as the dense model holding the reader's dequantized weights, and every KV block comes back.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from nanoserve import LLM, SamplingParams
from nanoserve.model.weights import load_hf_state_dict
from nanoserve.quantization.checkpoint import read_quantized
from nanoserve.quantization.fixtures import awq_checkpoint, gptq_checkpoint
from nanoserve.quantization.weight import QuantizedWeight
from nanoserve.testing import greedy_logits

KW = dict(dtype="float32", skip_tokenizer_init=True)
PROMPTS = [[5, 17, 3, 99, 42], [200, 7, 7, 1, 64, 80, 31, 12, 9, 150, 4, 77]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
CASES = {  # id -> (writer, its keywords)
    "gptq-4bit-sym": (gptq_checkpoint, dict(bits=4, group_size=32, sym=True)),
    "gptq-4bit-act-order": (gptq_checkpoint, dict(bits=4, group_size=32, sym=False,
                                                  desc_act=True)),
    "gptq-8bit-v2": (gptq_checkpoint, dict(bits=8, group_size=-1, sym=False,
                                           checkpoint_format="gptq_v2")),
    "awq": (awq_checkpoint, dict(group_size=32)),
}


def write(folder, tensors, config):
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))


@pytest.mark.parametrize("case", CASES)
def test_served_as_the_reader_dequantizes(hf_checkpoint, tmp_path, case):
    src = hf_checkpoint("gqa")
    hf = load_hf_state_dict(src)
    config = json.loads((src / "config.json").read_text())
    writer, kw = CASES[case]
    tensors, qc = writer(hf, **kw)
    write(tmp_path / "quant", tensors, {**config, "quantization_config": qc})
    dense = {k: v.dequantize(torch.float32) if isinstance(v, QuantizedWeight) else v
             for k, v in read_quantized(dict(tensors), qc).items()}
    write(tmp_path / "dense", dense, config)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (src / f).is_file():
            shutil.copy(src / f, tmp_path / "quant" / f)
    ours, twin = LLM(str(tmp_path / "quant"), **KW), LLM(str(tmp_path / "dense"), **KW)
    assert ours.core.loaded.quantization.startswith(qc["quant_method"])
    for llm in (ours, twin):
        llm.out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        kv = llm.core.scheduler.kv_cache_manager
        assert kv.num_free == kv.num_blocks
    assert ours.out == twin.out
    for a, b in zip(greedy_logits(ours, PROMPTS[1], 3), greedy_logits(twin, PROMPTS[1], 3),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
