"""Attention backends as objects: one class per read path, chosen once, refusing what it lacks.

The registry (``nanoserve.config.registries``) names every backend; the selector turns a name into
its class and holds the class against what the model needs (``AttentionSpec``); a backend that
cannot serve the model is a ``ValueError`` naming the missing feature, before anything is built.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nanoserve.attention import selector
from nanoserve.attention.backends.base import AttentionBackend, AttentionSpec
from nanoserve.attention.paged import BatchedPagedKVCache
from nanoserve.config import ATTENTION_CHOICES, ATTENTION_PATHS, EngineConfig, ModelConfig
from nanoserve.config.registries import ATTENTION_BACKENDS

SPEC = AttentionSpec(num_q_heads=9, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16)


@pytest.mark.parametrize("name", ATTENTION_PATHS)
def test_every_registered_name_is_a_backend_class_of_that_name(name):
    cls = selector.backend_class(name)
    assert issubclass(cls, AttentionBackend) and cls.name == name
    assert cls.__module__ == f"nanoserve.attention.backends.{name}"


def test_the_option_accepts_exactly_the_registry_and_auto():
    assert ATTENTION_PATHS == tuple(ATTENTION_BACKENDS)
    assert ATTENTION_CHOICES == ("auto", *ATTENTION_PATHS)
    with pytest.raises(ValueError, match="choose one of"):
        selector.backend_class("flash")


def test_auto_is_the_cpu_kernel_where_the_ops_are_on_else_the_gathered_mapping():
    assert selector.resolve("auto", kernels=True) == "cpu"
    assert selector.resolve("auto", kernels=False) == "gathered"
    assert selector.resolve("reference", kernels=True) == "reference"


@pytest.mark.parametrize("name", ["reference", "gathered", "cpu"])
def test_a_backend_serves_a_llama_shaped_model(name):
    assert selector.choose(name, True, SPEC) == name


@pytest.mark.parametrize("change,missing", [
    (dict(sliding_window=4096), "a sliding window of 4096 tokens"),
    (dict(logit_softcap=30.0), "a logit soft-cap of 30.0"),
])
@pytest.mark.parametrize("name", ATTENTION_PATHS)
def test_choosing_a_backend_that_lacks_a_feature_is_refused_by_name(name, change, missing):
    spec = dataclasses.replace(SPEC, **change)
    if "sliding_window" in change:  # every registered backend reads windows now
        assert selector.choose(name, True, spec) == name
        cls = type("NoWindow", (selector.backend_class(name),), {"sliding_window": False})
        assert cls.unsupported(spec) == missing  # one that did not would be refused by name
        return
    with pytest.raises(ValueError, match=f"attention='{name}' cannot serve this model: it "
                                         f"does not support {missing}"):
        selector.choose(name, True, spec)


@pytest.mark.parametrize("spec,missing", [
    (AttentionSpec(9, 3, 64, torch.float16), "dtype float16"),
    (AttentionSpec(9, 3, 64, torch.float32, device="cuda"), "device cuda"),
    (AttentionSpec(130, 2, 64, torch.float32), "65 query heads of 64 per KV head"),
])
def test_the_cpu_kernel_refuses_what_it_cannot_read(spec, missing):
    with pytest.raises(ValueError, match=missing):
        selector.choose("cpu", True, spec)


def test_the_engine_refuses_a_windowed_model_before_loading_it(tmp_path, hf_checkpoint):
    """A Llama checkpoint whose config asks for a sliding window is refused at load by name:
    Llama's layers attend over the whole context (transformers' Llama ignores the key), and
    a windowed model says so by being a MistralForCausalLM."""
    import json
    import shutil

    from nanoserve import LLM

    path = tmp_path / "windowed"
    shutil.copytree(hf_checkpoint("gqa"), path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "sliding_window": 8}))
    assert ModelConfig.from_dir(path).sliding_window == 8
    with pytest.raises(ValueError, match="sliding_window=8 on a Llama checkpoint"):
        LLM(path, skip_tokenizer_init=True, attention="reference")


def test_the_cache_reads_through_its_backend_object():
    cache = BatchedPagedKVCache(1, 1, 4, 4, 4, 2, 16, attention="gathered")
    assert cache.attention == "gathered" and type(cache.backend).__name__ == "GatheredBackend"
    with pytest.raises(ValueError, match="choose one of"):
        BatchedPagedKVCache(1, 1, 4, 4, 4, 2, 16, attention="flash")


def test_engine_config_names_the_attention_choices():
    with pytest.raises(ValueError, match="attention='flash'; choose one of"):
        EngineConfig(attention="flash")
