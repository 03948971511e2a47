"""``nanoserve bench offline``: the harness itself, not a timing.

The workload is seeded and exact; static waves count only useful tokens; the nanoserve, hf and
hf-cb arms give the same greedy tokens in float32 on the shipped model; a missing vLLM venv is a
"skipped" row, never a number.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nanoserve import cli
from nanoserve.bench import shapes
from nanoserve.bench.adapters import HFGenerateEngine, NanoserveEngine, Setup
from nanoserve.bench.runner import run_offline
from nanoserve.bench.workload import Workload, make_workload, static_waves, wave_accounting
from nanoserve.llm import DEFAULT_MODEL


def test_default_workload_is_seeded_and_exact():
    wl = make_workload(vocab_size=2048)  # the command's defaults: 16, 16-192, 16-128, seed 0
    assert [len(p) for p in wl.prompts] == [114, 123, 26, 82, 146, 140, 119, 93, 138, 107, 165,
                                            71, 145, 51, 88, 51]
    assert wl.max_tokens == [112, 28, 95, 118, 48, 84, 106, 119, 93, 34, 55, 28, 109, 25, 124,
                             103]
    assert wl.useful_tokens == 1281
    assert wl.max_len == 254
    assert wl.prompts[0][:5] == [678, 968, 1148, 208, 726]
    again = make_workload(16, (16, 192), (16, 128), 2048, 0)
    assert again.prompts == wl.prompts and again.max_tokens == wl.max_tokens
    assert make_workload(vocab_size=2048, seed=1).prompts != wl.prompts
    assert all(2 <= t < 2048 for p in wl.prompts for t in p)
    head = wl.head(8, max_tokens=8)
    assert head.prompts == wl.prompts[:8] and head.max_tokens == [8] * 8
    with pytest.raises(ValueError):
        make_workload(0)
    with pytest.raises(ValueError):
        make_workload(4, (10, 5))


def test_static_waves_count_only_useful_tokens():
    assert static_waves(5, 2) == [[0, 1], [2, 3], [4]]
    acc = wave_accounting([3, 5, 2, 7, 4], batch=2)
    # waves [3, 5] -> 2 rows x 5, [2, 7] -> 2 x 7, [4] -> 1 x 4: 28 decoded, 21 useful
    assert acc == {"waves": 3, "useful_tokens": 21, "computed_tokens": 28, "wasted_tokens": 7}
    assert wave_accounting(make_workload(vocab_size=2048).max_tokens, 8) == {
        "waves": 2, "useful_tokens": 1281, "computed_tokens": 1944, "wasted_tokens": 663}


class _FakeHF:
    """Stands in for a transformers model: records each wave, answers with counting tokens."""

    def __init__(self):
        self.calls = []

    def generate(self, ids, attention_mask, generation_config):
        n = generation_config.max_new_tokens
        self.calls.append((ids.shape[0], ids.shape[1], n, attention_mask.sum(1).tolist()))
        new = torch.arange(n).repeat(ids.shape[0], 1) + 1000
        return torch.cat([ids, new], dim=1)


def test_hf_waves_run_to_the_longest_and_keep_each_requests_own_tokens():
    eng = object.__new__(HFGenerateEngine)
    eng.model, eng.pad = _FakeHF(), 0
    eng.s = Setup(DEFAULT_MODEL, "float32", "cpu", batch=2, max_model_len=64)
    wl = Workload([[5] * 3, [6] * 7, [7] * 2, [8] * 4, [9]], [3, 5, 2, 7, 4], 0, (1, 7), (2, 7))
    outs = eng.run(wl)
    # each wave is left-padded to its longest prompt and decodes to its longest budget
    assert eng.model.calls == [(2, 7, 5, [3, 7]), (2, 4, 7, [2, 4]), (1, 1, 4, [1])]
    assert [len(o) for o in outs] == wl.max_tokens
    assert outs[0] == [1000, 1001, 1002]


@pytest.fixture
def one_thread():
    """One torch thread: on a shared, loaded CPU, OpenMP threads spinning for a descheduled
    sibling make small models many times slower. Tokens do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# A prompt after which the shipped model's greedy reply holds its EOS (id 1) at position 12: with
# EOS ignored, every arm must go on past it, and the same way.
EOS_PROMPT = [1854, 1173, 1167, 215, 1463, 1344, 434, 1298, 1705, 2025, 1176, 548, 585, 256, 131,
              989, 1750, 1310, 2029, 992, 183, 706, 1641, 138, 842, 1839, 310, 43, 603, 876,
              1576, 852, 1789, 245, 92, 1241]


def test_nanoserve_and_transformers_arms_give_the_same_greedy_tokens(one_thread):
    base = make_workload(3, (4, 24), (4, 12), vocab_size=2048, seed=0)
    wl = Workload(base.prompts + [EOS_PROMPT], base.max_tokens + [16], 0, (4, 36), (4, 16))
    setup = Setup(DEFAULT_MODEL, "float32", "cpu", batch=2, max_model_len=wl.max_len)
    result = run_offline(setup, wl, ["nanoserve", "hf", "hf-cb"], rounds=1, warmup=False)
    rows = {r["engine"]: r for r in result["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    ref = result["token_ids"]["nanoserve"]
    assert [len(t) for t in ref] == wl.max_tokens == [8, 12, 11, 16]
    assert ref[3][12] == 1, "the EOS case no longer produces an EOS: pick another prompt"
    assert result["token_ids"]["hf"] == ref
    assert result["token_ids"]["hf-cb"] == ref
    assert rows["hf"]["same_tokens_as_nanoserve"] == 4
    assert rows["hf"]["static_waves"]["computed_tokens"] == 2 * 12 + 2 * 16
    assert rows["nanoserve"]["nanoserve_ratio"] == 1.0


def test_a_missing_vllm_venv_is_a_skipped_row(tmp_path):
    absent = tmp_path / "no-venv"
    wl = make_workload(2, (4, 8), (2, 4), vocab_size=2048)
    setup = Setup(DEFAULT_MODEL, "float32", "cpu", batch=2, max_model_len=wl.max_len,
                  vllm_venv=absent)
    [row] = run_offline(setup, wl, ["vllm"], rounds=1)["rows"]
    assert row["status"] == "skipped" and str(absent) in row["reason"]
    assert row["tokens_per_s"] is None and row["rounds_s"] == []


def test_the_command_reports_the_skip_in_its_json(tmp_path, capsys):
    code = cli.main(["bench", "offline", "--engines", "vllm", "--requests", "2",
                     "--vllm-venv", str(tmp_path / "absent"), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"][0]["status"] == "skipped"
    assert report["ratios"] == {}
    assert report["hardware"]["cores"] >= 1 and report["hardware"]["cpu"]
    assert report["workload"]["useful_tokens"] == make_workload(2, vocab_size=2048).useful_tokens


def test_shapes_match_the_published_configs():
    from chapters.common import LLAMA_3_2_1B

    assert shapes.SHAPES["llama-3.2-1b"] == LLAMA_3_2_1B
    s = shapes.shape_config("smollm2-135m")
    assert (s["hidden_size"], s["num_hidden_layers"], s["num_attention_heads"],
            s["num_key_value_heads"], s["head_dim"], s["intermediate_size"],
            s["vocab_size"], s["tie_word_embeddings"], s["rope_theta"],
            s["max_position_embeddings"]) == (576, 30, 9, 3, 64, 1536, 49152, True, 100000.0,
                                              8192)
    assert shapes.shape_config("tiny") == json.loads(
        (Path(DEFAULT_MODEL) / "config.json").read_text())


def test_a_shape_checkpoint_is_written_once_by_transformers(tmp_path):
    path = shapes.shape_checkpoint("tiny", cache=tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    shipped = shapes.shape_config("tiny")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings"):
        assert cfg[key] == shipped[key], key
    assert (path / "model.safetensors").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert shapes.shape_checkpoint("tiny", cache=tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary folder left


def test_nanoserve_options_pass_through_and_unknown_ones_are_refused():
    setup = Setup(DEFAULT_MODEL, "float32", "cpu", batch=2, max_model_len=64,
                  nanoserve_options={"block_size": 8})
    eng = NanoserveEngine(setup)
    assert eng.notes == ["block_size=8"]
    assert eng.llm.max_num_seqs == 2 and eng.llm.max_model_len == 64
    bad = Setup(DEFAULT_MODEL, "float32", "cpu", batch=2, max_model_len=64,
                nanoserve_options={"block_size": 8, "no_such_option": 1})
    with pytest.raises(ValueError, match="no_such_option"):
        NanoserveEngine(bad)


def test_the_command_refuses_an_unknown_llm_option_by_name(capsys):
    code = cli.main(["bench", "offline", "--engines", "nanoserve", "--requests", "2",
                     "--rounds", "1", "--llm-option", "no-such-option=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "nanoserve bench offline: error:" in err and "no_such_option" in err
