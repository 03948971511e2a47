"""``EngineConfig``: one field per option, one check per limit, one flag per field.

Every front door (``LLM``, ``AsyncLLM``, ``nanoserve serve``, ``nanoserve generate``) builds from
it, so each refusal below is the same refusal everywhere: an unknown option, an unknown flag and
a bad value each get an error that names the option.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from nanoserve import LLM, AsyncLLM, EngineConfig
from nanoserve.cli import main as cli
from nanoserve.config import ConfigError
from nanoserve.entrypoints.openai.serve import add_arguments

# Every flag `nanoserve serve --help` listed before the config existed: none may change spelling.
SERVE_FLAGS_BEFORE = (
    "--model", "--served-model-name", "--host", "--port", "--dtype", "--device",
    "--max-model-len", "--block-size", "--num-kv-blocks", "--max-num-seqs",
    "--skip-tokenizer-init", "--api-key", "--max-waiting", "--chat-template", "--max-body-bytes",
    "--drain-timeout", "--log-level", "--compile", "--no-compile", "--attention", "--cuda-graphs",
    "--persistent-batch", "--no-persistent-batch")


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve serve", allow_abbrev=False)
    add_arguments(p)
    return p


def test_the_config_is_frozen_slotted_and_every_field_says_what_it_is():
    cfg = EngineConfig()
    assert not hasattr(cfg, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_num_seqs = 3
    for f in dataclasses.fields(EngineConfig):
        assert f.metadata["help"], f.name
        assert "vllm" in f.metadata and "flag" in f.metadata, f.name
        assert f.default is not dataclasses.MISSING, f"{f.name} has no default"


def test_an_unknown_llm_keyword_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown engine option 'max_num_seq' "
                                         r"\(did you mean 'max_num_seqs'\?\)"):
        LLM(max_num_seq=4)
    with pytest.raises(ValueError, match="unknown engine option 'warp_speed'"):
        AsyncLLM.from_options(warp_speed=9)


@pytest.mark.parametrize("options,field,limit", [
    ({"block_size": 0}, "block_size", "block_size must be >= 1, got 0"),
    ({"max_num_seqs": -2}, "max_num_seqs", "max_num_seqs must be >= 1, got -2"),
    ({"num_kv_blocks": 1.5}, "num_kv_blocks", "num_kv_blocks must be an int"),
    ({"batching": "wavy"}, "batching", "batching='wavy'; choose one of"),
    ({"attention": "flash"}, "attention", "attention='flash'; choose one of"),
    ({"max_model_len": 1}, "max_model_len", "max_model_len must be an int >= 2"),
    ({"prepack": "yes"}, "prepack", "prepack='yes'; choose one of"),
    ({"model": "/no/such/folder"}, "model", "model folder /no/such/folder does not exist"),
    ({"fail_on_step": (0,)}, "fail_on_step", "fail_on_step holds step numbers >= 1"),
])
def test_a_bad_value_names_its_field_and_limit(options, field, limit):
    with pytest.raises(ConfigError, match=limit) as info:
        EngineConfig(**options)
    assert info.value.field == field
    with pytest.raises(ValueError, match=limit):  # the same check at the offline door
        LLM(**options)


def test_max_model_len_is_checked_against_the_model():
    with pytest.raises(ValueError, match=r"max_model_len must be in \[2, 1024\]"):
        LLM(max_model_len=4096)


def test_an_unknown_flag_and_a_bad_flag_value_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as info:
        cli(["serve", "--max-num-seq", "4"])  # no abbreviations: a typo is not another flag
    assert info.value.code == 2
    assert "unrecognized arguments: --max-num-seq" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["serve", "--block-size", "four"])
    assert "argument --block-size: invalid int value: 'four'" in capsys.readouterr().err
    assert cli(["serve", "--block-size", "0"]) == 2  # parses, then the config refuses it
    assert "--block-size: block_size must be >= 1, got 0" in capsys.readouterr().err
    assert cli(["generate", "hi", "--max-num-seqs", "0"]) == 2
    assert "--max-num-seqs: max_num_seqs must be >= 1" in capsys.readouterr().err


def test_serve_help_lists_every_engine_option_with_its_default():
    text = serve_parser().format_help()
    text = text[text.index("engine options:"):]  # past the usage line
    for f in dataclasses.fields(EngineConfig):
        flag = EngineConfig.flag(f.name)
        assert flag in text, flag
        entry = text[text.index(flag):].split("\n  --", 1)[0]
        assert "(default:" in entry, f"{flag} does not say its default"


def test_every_flag_keeps_its_spelling_and_vllm_aliases_are_accepted():
    p = serve_parser()
    spelled = {s for a in p._actions for s in a.option_strings}
    assert set(SERVE_FLAGS_BEFORE) <= spelled
    ns = p.parse_args(["--num-gpu-blocks-override", "7", "--max-num-seqs", "3",
                       "--no-persistent-batch", "--cuda-graphs", "--prepack", "off"])
    cfg = EngineConfig.from_cli_args(ns)
    assert (cfg.num_kv_blocks, cfg.max_num_seqs, cfg.cuda_graphs, cfg.persistent_batch,
            cfg.prepack) == (7, 3, True, False, False)
    assert EngineConfig.from_cli_args(p.parse_args([])) == EngineConfig()


def test_the_defaults_of_the_flags_are_the_defaults_of_the_fields():
    ns = serve_parser().parse_args([])
    for name in EngineConfig.names():
        default = EngineConfig.__dataclass_fields__[name].default
        assert getattr(ns, name) == (None if name == "model" else default), name


def test_the_server_gets_its_own_budget_and_keeps_every_one_it_is_given():
    from nanoserve.config.engine import DEFAULT_BATCHED_TOKENS, SERVE_BATCHED_TOKENS

    assert SERVE_BATCHED_TOKENS < DEFAULT_BATCHED_TOKENS
    assert EngineConfig().for_serving().max_num_batched_tokens == SERVE_BATCHED_TOKENS
    assert EngineConfig().resolve_max_num_batched_tokens(1024) == DEFAULT_BATCHED_TOKENS
    wide = EngineConfig(max_num_seqs=SERVE_BATCHED_TOKENS + 8).for_serving()
    assert wide.max_num_batched_tokens == SERVE_BATCHED_TOKENS + 8  # a full batch decodes
    given = EngineConfig(max_num_batched_tokens=512)
    assert given.for_serving() is given
    whole = EngineConfig(enable_chunked_prefill=False)
    assert whole.for_serving() is whole
    assert whole.for_serving().resolve_max_num_batched_tokens(1024) == 1024
