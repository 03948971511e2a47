"""``nanoserve bench quant``'s arithmetic, without timing anything: the bytes a decode step reads
(``quant_arms.step_bytes``) and the ratios the report derives from the rows
(``quant_report.summarize``). The timed run itself is ``make bench-peers``."""

import pytest

from nanoserve.bench.quant_arms import first_divergence, step_bytes
from nanoserve.bench.quant_report import summarize
from nanoserve.quantize.command import quantize_checkpoint
from nanoserve.testing import write_hf_checkpoint


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    dense = write_hf_checkpoint(root / "dense", "gqa", tie_word_embeddings=True)
    return {"bf16": dense, **{s: quantize_checkpoint(dense, root / s, s, 32)
                              for s in ("w8a16", "w4a16")}}


def test_step_bytes_count_the_linears_scales_and_the_head(folders):
    # hidden 64, intermediate 128, 8 heads of 8 (q 64, kv 16 each), 2 layers, vocab 256
    per_layer = 64 * 64 * 2 + 64 * 16 * 2 + 3 * 64 * 128
    linears, head = 2 * per_layer, 256 * 64
    f32 = step_bytes(folders["bf16"])  # write_hf_checkpoint stores float32
    assert f32 == {"linears": 4 * linears, "head": 4 * head, "total": 4 * (linears + head)}
    for scheme, per_weight in (("w8a16", 1 + 2 / 32), ("w4a16", 0.5 + 2 / 32)):
        got = step_bytes(folders[scheme])  # bf16 scales, one per 32 inputs; the head in bf16
        assert got["linears"] == linears * per_weight and got["head"] == 2 * head


def _row(engine, weights, threads, tps, tokens=(1, 2, 3)):
    return {"engine": engine, "weights": weights, "threads": threads, "status": "ok",
            "arm": f"{engine} {weights}", "tokens": list(tokens),
            "rounds": [{"decode_tokens_per_s": tps, "prompt_s": 0.1},
                       {"decode_tokens_per_s": tps / 2, "prompt_s": 0.2}]}


def test_summarize_ratios():
    report = {"step_bytes": {"bf16": {"total": 300}, "w8a16": {"total": 200},
                             "w4a16": {"total": 100}},
              "rows": [_row("nanoserve", "bf16", 1, 50), _row("llamacpp", "bf16", 1, 40),
                       _row("nanoserve", "w4a16", 1, 120, (1, 2, 4)),
                       _row("llamacpp", "w4a16", 1, 100),
                       {**_row("nanoserve", "w8a16", 1, 0), "status": "error", "rounds": []}]}
    summarize(report)
    ns_bf16, lc_bf16, ns4, lc4, ns8 = report["rows"]
    assert ns_bf16["decode_tokens_per_s"] == 50 and ns_bf16["prompt_ms"] == 100
    assert ns_bf16["ratio_over_llamacpp"] == 1.25
    assert ns4["byte_ceiling"] == 3.0 and ns4["speedup_over_bf16"] == 2.4
    assert ns4["fraction_of_ceiling"] == 0.8 and ns4["ratio_over_llamacpp"] == 1.2
    assert ns4["greedy_tokens_shared_with_llamacpp"] == 2
    assert lc4["speedup_over_bf16"] == 2.5
    assert ns8["decode_tokens_per_s"] is None and "ratio_over_llamacpp" not in ns8


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
