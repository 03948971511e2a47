"""Checkpoint folders: single file, sharded index, dtypes, and every way a folder can be wrong."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from nanoserve import LLM
from nanoserve.config import ModelConfig
from nanoserve.model.weights import choose_dtype, load_model, resolve_dtype
from nanoserve.testing import load_hf_model, relative_logit_error, write_hf_checkpoint


def test_sharded_checkpoint_loads_and_matches(tmp_path):
    path = write_hf_checkpoint(tmp_path / "sharded", "gqa", max_shard_size="60KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("model-*.safetensors"))) > 1
    ours, ref = load_model(path, "float32"), load_hf_model(path)
    ids = torch.arange(3, 23)[None]
    with torch.no_grad():
        err = relative_logit_error(ours.compute_logits(ours(ids, torch.arange(20)[None])),
                                   ref(ids).logits)
    assert err < 1e-4


def test_eos_token_id_int_or_list():
    base = {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2}
    assert ModelConfig.from_dict({**base, "eos_token_id": 7}).eos_token_ids == (7,)
    assert ModelConfig.from_dict({**base, "eos_token_id": [5, 6]}).eos_token_ids == (5, 6)
    assert ModelConfig.from_dict({**base, "head_dim": 16}).head_dim == 16


def test_rope_scaling_in_either_spelling():
    base = {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2}
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    old = ModelConfig.from_dict({**base, "rope_theta": 500000.0, "rope_scaling": scaling})
    new = ModelConfig.from_dict({**base, "rope_parameters": {**scaling, "rope_theta": 500000.0}})
    assert old.rope_theta == new.rope_theta == 500000.0
    assert old.rope_scaling == new.rope_scaling == scaling


@pytest.mark.parametrize("dtype,expected", [("float32", torch.float32), ("bf16", torch.bfloat16),
                                            ("float16", torch.float16), ("auto", None)])
def test_dtypes(hf_checkpoint, dtype, expected):
    path = hf_checkpoint("gqa")
    if expected is None:  # auto on a CPU: what this machine's measurement chose for this model
        expected = choose_dtype("auto", ModelConfig.from_dir(path), "cpu")[0]
    assert load_model(path, dtype).embed_tokens.weight.dtype == expected


def test_unknown_dtype_is_refused(hf_checkpoint):
    with pytest.raises(ValueError, match="dtype='float8'.*float32"):
        LLM(hf_checkpoint("gqa"), dtype="float8", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype(torch.int8)


def test_missing_folder_and_files(tmp_path, hf_checkpoint):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(tmp_path / "nope")
    src = hf_checkpoint("gqa")
    for missing, pattern in [("config.json", "config.json is missing"),
                             ("model.safetensors", "neither model.safetensors")]:
        broken = tmp_path / f"no-{missing}"
        shutil.copytree(src, broken)
        (broken / missing).unlink()
        with pytest.raises(ValueError, match=pattern):
            LLM(broken, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="tokenizer.json is missing"):
        LLM(src)


def test_missing_shard(tmp_path):
    path = write_hf_checkpoint(tmp_path / "sharded", "gqa", max_shard_size="60KB")
    next(path.glob("model-*.safetensors")).unlink()
    with pytest.raises(ValueError, match="shard .* is missing"):
        load_model(path)


def test_missing_tensor(tmp_path, hf_checkpoint):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "missing-tensor"
    shutil.copytree(hf_checkpoint("gqa"), broken)
    state = load_file(broken / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, broken / "model.safetensors")
    with pytest.raises(ValueError, match="missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        load_model(broken)


@pytest.mark.parametrize("change,pattern", [
    ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}, "supports only"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 3}, "not a multiple"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
])
def test_unsupported_config_is_refused(tmp_path, hf_checkpoint, change, pattern):
    broken = tmp_path / "cfg"
    shutil.copytree(hf_checkpoint("gqa"), broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg.update(change)
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=pattern):
        LLM(broken, skip_tokenizer_init=True)


def test_cuda_refused_without_cuda(hf_checkpoint):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA is not available"):
        LLM(hf_checkpoint("gqa"), device="cuda", skip_tokenizer_init=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_half_matches_cpu_fp32(hf_checkpoint, dtype):
    path = hf_checkpoint("gqa")
    cpu, gpu = load_model(path, "float32"), load_model(path, dtype, "cuda")
    ids = torch.arange(3, 40)[None]
    pos = torch.arange(37)[None]
    with torch.no_grad():
        err = relative_logit_error(gpu.compute_logits(gpu(ids.cuda(), pos.cuda())).cpu(),
                                   cpu.compute_logits(cpu(ids, pos)))
    assert err < 5e-2
