"""``nanoserve bench spec`` without timing anything: its workloads (deterministic, copy-heavy
prompts holding their own opening twice, held-out passages from the held-out split), the
speed-up it predicts for a draft, the figures it derives from rows, vLLM's metrics as the runner
reads them, and a ``--quick`` run whose speculative outputs are the unspeculated ones token for
token. The timed run itself is ``nanoserve bench spec`` (``make bench-peers`` with vLLM)."""

import argparse
import json
from types import SimpleNamespace

import pytest

from nanoserve.bench import spec
from nanoserve.bench.spec_arms import _write_truncated, predicted_speedup
from nanoserve.bench.spec_report import summarize
from nanoserve.bench.spec_workload import (
    copy_heavy,
    forced_repeat,
    no_repeat,
    reopened,
    split_docs,
)
from nanoserve.bench.vllm_runner import _metrics
from nanoserve.config import DEFAULT_MODEL


def test_copy_heavy_prompts_hold_their_opening_twice_and_are_deterministic():
    w = copy_heavy("train", 4, passage_len=96, reopen=16, max_tokens=32, seed=3)
    assert w.prompts == copy_heavy("train", 4, 96, 16, 32, seed=3).prompts
    assert w.prompts != copy_heavy("train", 4, 96, 16, 32, seed=4).prompts
    docs = split_docs("train")
    for p, (doc, at) in zip(w.prompts, w.sources, strict=True):
        passage = list(docs[doc][at:at + 96])
        assert p[:96] == passage and len(p) == 96 + 16
        start = 1 if passage[0] == 0 else 0  # a document's first window opens with BOS
        assert p[96:] == passage[start:start + 16]  # the opening, a second time
        assert len(docs[doc]) >= at + 96 + 32  # the passage goes on past what is copied


def test_held_out_passages_come_from_the_held_out_documents():
    from nanoserve.model.text_loss import corpus
    from nanoserve.tokenizer import Tokenizer

    train_docs, val_docs = corpus()
    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    w = copy_heavy("val", 3, passage_len=64, reopen=8, max_tokens=16)
    assert w.name == "copy-heavy-val"
    for p, (doc, at) in zip(w.prompts, w.sources, strict=True):
        assert p[:64] == tok.encode(val_docs[doc])[at:at + 64]
    assert not set(val_docs) & set(train_docs)


def test_reopened_and_its_refusal():
    assert reopened([9, 8, 7], 2) == [9, 8, 7, 9, 8]  # no BOS: the first tokens again
    with pytest.raises(ValueError, match="reopen=5"):
        reopened([0, 1, 2], 5)


def test_no_repeat_prompts_have_no_token_twice():
    w = no_repeat(3, 200, vocab_size=2048, seed=1)
    assert w.prompts == no_repeat(3, 200, vocab_size=2048, seed=1).prompts
    for p in w.prompts:
        assert len(set(p)) == 200 and not {0, 1} & set(p)
    assert len({tuple(p) for p in w.prompts}) == 3


def test_forced_repeat_holds_the_start_of_its_own_continuation():
    def greedy(prompts, n):  # a stand-in target: continues with its last token forever
        return [[p[-1]] * n for p in prompts]

    w = forced_repeat(greedy, 2, 10, vocab_size=100, m=4, max_tokens=6)
    for p, ref in zip(w.prompts, w.references, strict=True):
        assert len(p) == 14 and p[10:] == [p[9]] * 4 and ref == [p[9]] * 6
    assert "distinct tokens in it: [1]" in w.description


def test_predicted_speedup():
    assert predicted_speedup(1.0, 4, 0.0) == 5.0  # every proposal kept, free draft
    assert predicted_speedup(0.0, 4, 0.25) == 0.5  # nothing kept: a step costs 1 + k c
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 1.4)
    assert predicted_speedup(1 - 1e-9, 3, 1.0) == pytest.approx(predicted_speedup(1, 3, 1))
    # a verify step costing 2 plain steps halves the free draft's 5x
    assert predicted_speedup(1.0, 4, 0.0, verify=2.0) == 2.5
    with pytest.raises(ValueError):
        predicted_speedup(1.5, 4, 0.1)


def _row(arm, spec_, decode, e2e, batch=1, section="copy", **extra):
    return {"section": section, "engine": "nanoserve", "model": "m", "dtype": "float32",
            "workload": "w", "batch": batch, "threads": 1, "arm": arm, "spec": spec_,
            "status": "ok", "outputs": [[1, 2, 3]],
            "rounds": [{"decode_tokens_per_s": decode, "e2e_tokens_per_s": e2e},
                       {"decode_tokens_per_s": decode / 2, "e2e_tokens_per_s": e2e / 2}],
            **extra}


def test_summarize_ratios_targets_and_the_draft_prediction():
    ngram = {"method": "ngram", "num_speculative_tokens": 4}
    draft = {"method": "draft_model", "num_speculative_tokens": 4, "model": "d"}
    rows = [_row("off", None, 100, 50), _row("ngram", ngram, 250, 80),
            _row("off", None, 400, 200, batch=8), _row("ngram", ngram, 480, 210, batch=8),
            _row("off", None, 100, 50, section="draft"),
            _row("draft", draft, 200, 90, section="draft", c=0.25, acceptance_rate=0.8,
                 verify_cost_in_steps=2.0)]
    rows[3]["outputs"] = [[1, 2, 4]]
    report = {"rows": rows}
    summarize(report)
    assert rows[1]["decode_tokens_per_s"] == 250 and rows[1]["speedup_decode"] == 2.5
    assert rows[1]["speedup_e2e"] == 1.6 and rows[1]["target"] == 2.0 and rows[1]["met"]
    assert rows[3]["target"] == 1.3 and not rows[3]["met"]  # 1.2x
    assert rows[1]["identical_to_off"] and rows[3]["identical_to_off"] is False
    want = predicted_speedup(0.8, 4, 0.25)
    assert rows[5]["predicted_speedup"] == round(want, 3)
    assert rows[5]["within_15pct"] == (abs(2.0 / round(want, 3) - 1) <= 0.15)
    assert rows[5]["predicted_with_verify_cost"] == round(predicted_speedup(0.8, 4, 0.25, 2), 3)
    assert all("outputs" not in r and "outputs_sha1" in r for r in rows)
    assert [t["arm"] for t in report["targets"]] == ["ngram", "ngram"]


def test_vllm_metrics_are_read_as_numbers():
    got = _metrics(SimpleNamespace(get_metrics=lambda: [
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=3),
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=2),  # another label set
        SimpleNamespace(name="vllm:request_decode_time_seconds", sum=1.5, count=2,
                        buckets={}),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[4, 1])]))
    assert got == {"vllm:spec_decode_num_drafts": 5,
                   "vllm:request_decode_time_seconds:sum": 1.5,
                   "vllm:request_decode_time_seconds:count": 2,
                   "vllm:spec_decode_num_accepted_tokens_per_pos": [4, 1]}


def test_truncated_draft_keeps_the_first_layers(tmp_path):
    from safetensors.torch import load_file

    out = _write_truncated(DEFAULT_MODEL, tmp_path / "d", 1)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    names = load_file(out / "model.safetensors")
    assert any(".layers.0." in n for n in names) and not any(".layers.1." in n for n in names)
    assert (out / "tokenizer.json").is_file()


def _args(*argv):
    p = argparse.ArgumentParser()
    spec.add_arguments(p)
    return p.parse_args(list(argv))


def test_bad_flags_are_refused_by_name(capsys):
    assert spec.main(_args("--lookups", "5:2")) == 2
    assert "--lookups" in capsys.readouterr().err
    assert spec.main(_args("--sections", "copy,nope")) == 2


def test_quick_run_shape_and_identical_outputs(tmp_path):
    out = tmp_path / "spec.json"
    assert spec.main(_args("--quick", "--out", str(out))) == 0
    report = json.loads(out.read_text())
    assert {"hardware", "rows", "targets", "workloads", "figures"} <= set(report)
    rows = report["rows"]
    # off and one ngram arm, two workloads (train, val), one request and a batch of 2
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        assert r["status"] == "ok", r.get("reason")
        for key in ("model", "dtype", "workload", "batch", "threads", "decode_tokens_per_s",
                    "e2e_tokens_per_s"):
            assert r[key] is not None, key
    spec_rows = [r for r in rows if r["spec"] is not None]
    assert spec_rows and all(r["identical_to_off"] for r in spec_rows)
    assert all(r["num_drafts"] >= 0 and "speedup_decode" in r for r in spec_rows)
    assert {t["target"] for t in report["targets"]} == {2.0, 1.3}
