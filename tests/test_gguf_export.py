"""The GGUF writer (nanoserve/bench/gguf_export.py), read back with the gguf package's own reader.

What is checked against a reference we did not write: every tensor of the written file,
dequantized by ``gguf.quants.dequantize`` (the package's reading of Q8_0, Q4_0 and BF16), equals
the checkpoint's weight exactly: ``QuantizedWeight.dequantize`` for a quantized linear, the
bf16 (or f32) tensor for a dense one, with q and k rows in llama.cpp's rotary order. Then the
Llama metadata and vocabulary keys, and the refusals. No llama.cpp is needed here; the bench
runs it (``nanoserve bench quant``).
"""

import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from nanoserve.bench.gguf_export import export_gguf, read_checkpoint, rope_rows  # noqa: E402
from nanoserve.quantization.weight import QuantizedWeight  # noqa: E402
from nanoserve.quantize.command import quantize_checkpoint  # noqa: E402
from nanoserve.testing import write_hf_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A random GQA Llama (8 heads, 2 KV heads, hidden 64), tied head, in bf16."""
    path = tmp_path_factory.mktemp("dense")
    write_hf_checkpoint(path, "gqa", tie_word_embeddings=True, torch_dtype="bfloat16")
    config = json.loads((path / "config.json").read_text())
    from safetensors.torch import load_file, save_file

    hf = load_file(path / "model.safetensors")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in hf.items()},
              path / "model.safetensors", metadata={"format": "pt"})
    return path, config


def _read(path):
    r = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in r.tensors}
    return r, tensors


def _deq(t) -> torch.Tensor:
    """A reader tensor dequantized by the gguf package, as (rows, cols) float32."""
    return torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type),
                                     dtype=np.float32)).reshape(
        int(t.shape[1]) if len(t.shape) > 1 else -1, int(t.shape[0]))


def _expected(name: str, w, config) -> torch.Tensor:
    w = w.dequantize(torch.float32) if isinstance(w, QuantizedWeight) else w.to(torch.float32)
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
        w = w[rope_rows(w.shape[0], heads)]
    return w.reshape(w.shape[0], -1) if w.dim() == 2 else w.reshape(1, -1)


@pytest.mark.parametrize("scheme,kind", [(None, "BF16"), ("w8a16", "Q8_0"),
                                         ("w4a16", "Q4_0")])
def test_written_tensors_dequantize_to_the_checkpoints_weights(dense, tmp_path, scheme, kind):
    src, config = dense
    folder = src if scheme is None else quantize_checkpoint(src, tmp_path / scheme, scheme, 32)
    info = export_gguf(folder, tmp_path / "m.gguf")
    _, tensors = _read(tmp_path / "m.gguf")
    _, hf = read_checkpoint(folder)
    from nanoserve.bench.gguf_export import gguf_name

    assert set(tensors) == {gguf_name(k) for k in hf}  # tied: no output.weight
    assert "output.weight" not in tensors
    for name, w in hf.items():
        t = tensors[gguf_name(name)]
        want = _expected(name, w, config)
        got = _deq(t)
        assert torch.equal(got, want), name
        if name.endswith("_proj.weight"):
            assert t.tensor_type.name == kind, name
    assert tensors["token_embd.weight"].tensor_type.name == "BF16"  # the head: bf16 in both
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    assert info["file_type"] == {"BF16": "MOSTLY_BF16", "Q8_0": "MOSTLY_Q8_0",
                                 "Q4_0": "MOSTLY_Q4_0"}[kind]


def test_q4_0_nibble_layout_by_hand(tmp_path):
    """One block, written by hand from the layout (not the writer): u = q + 8, low nibbles the
    first 16 values, high nibbles the last 16; gguf.quants reads it as d * (u - 8)."""
    from nanoserve.bench.gguf_export import q4_0_blocks

    q = torch.arange(-8, 24, dtype=torch.int8).remainder(16).sub(8).to(torch.int8)[None]
    qw = QuantizedWeight(q, torch.tensor([[0.5]], dtype=torch.bfloat16), None, 4, 32)
    u = (q[0].to(torch.int16) + 8).to(torch.uint8)
    by_hand = np.concatenate([np.array([0.5], np.float16).view(np.uint8),
                              (u[:16] | (u[16:] << 4)).numpy()])
    assert np.array_equal(q4_0_blocks("x", qw)[0], by_hand)
    back = gguf.quants.dequantize(by_hand[None], gguf.GGMLQuantizationType.Q4_0)
    assert np.array_equal(back[0], q[0].numpy().astype(np.float32) * 0.5)


def test_llama_metadata_and_vocab_keys(dense, tmp_path):
    src, config = dense
    export_gguf(src, tmp_path / "m.gguf")
    r, _ = _read(tmp_path / "m.gguf")
    f = r.fields

    def value(key):
        return f[key].contents()

    assert value("general.architecture") == "llama"
    want = {"llama.context_length": config["max_position_embeddings"],
            "llama.embedding_length": config["hidden_size"],
            "llama.block_count": config["num_hidden_layers"],
            "llama.feed_forward_length": config["intermediate_size"],
            "llama.attention.head_count": config["num_attention_heads"],
            "llama.attention.head_count_kv": config["num_key_value_heads"],
            "llama.rope.dimension_count": config["hidden_size"] // config["num_attention_heads"],
            "llama.vocab_size": config["vocab_size"]}
    for key, v in want.items():
        assert value(key) == v, key
    assert value("llama.rope.freq_base") == pytest.approx(
        config["rope_parameters"]["rope_theta"])  # transformers 5 nests it
    assert value("llama.attention.layer_norm_rms_epsilon") == pytest.approx(
        config["rms_norm_eps"])
    assert value("tokenizer.ggml.model") == "gpt2"
    assert len(value("tokenizer.ggml.tokens")) == config["vocab_size"]
    assert len(value("tokenizer.ggml.token_type")) == config["vocab_size"]
    assert "tokenizer.ggml.merges" in f and "tokenizer.ggml.bos_token_id" in f


def test_shipped_tokenizer_becomes_the_vocab(tmp_path):
    from nanoserve.bench.gguf_vocab import gguf_vocab
    from nanoserve.config import DEFAULT_MODEL

    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    tok = json.loads((DEFAULT_MODEL / "tokenizer.json").read_text())
    v = gguf_vocab(DEFAULT_MODEL, config)
    assert len(v.tokens) == config["vocab_size"]
    assert all(v.tokens[i] == t for t, i in tok["model"]["vocab"].items())
    assert v.types[0] == 3 and v.types[5] == 1  # <|begin_of_text|> is a control token
    assert v.merges[0] == " ".join(tok["model"]["merges"][0])


def test_refusals(dense, tmp_path):
    src, _ = dense
    g64 = quantize_checkpoint(src, tmp_path / "g64", "w4a16", 64)
    with pytest.raises(ValueError, match=r"group_size 64.*Q4_0 holds 4-bit symmetric weights "
                                         r"in groups of 32"):
        export_gguf(g64, tmp_path / "a.gguf")
    asym = quantize_checkpoint(src, tmp_path / "asym", "w8a16", 32, symmetric=False)
    with pytest.raises(ValueError, match="symmetric=false; GGUF Q8_0 and Q4_0 have no zero"):
        export_gguf(asym, tmp_path / "b.gguf")
    f32 = quantize_checkpoint(src, tmp_path / "f32", "w8a16", 32, dtype="float32")
    with pytest.raises(ValueError, match=r"proj: weight_scale .* is not an fp16 number"):
        export_gguf(f32, tmp_path / "c.gguf")
    w8a8 = quantize_checkpoint(src, tmp_path / "w8a8", "w8a8")
    with pytest.raises(ValueError, match="format='int-quantized'"):
        export_gguf(w8a8, tmp_path / "d.gguf")


def test_scale_out_of_fp16_range_is_refused():
    from nanoserve.bench.gguf_export import q8_0_blocks

    q = torch.zeros(1, 32, dtype=torch.int8)
    big = QuantizedWeight(q, torch.tensor([[1e6]], dtype=torch.bfloat16), None, 8, 32)
    with pytest.raises(ValueError, match=r"layer: weight_scale 999424.0 .* not an fp16"):
        q8_0_blocks("layer", big)
    tiny = QuantizedWeight(q, torch.tensor([[2.0 ** -30]], dtype=torch.bfloat16), None, 8, 32)
    with pytest.raises(ValueError, match="not an fp16 number"):
        q8_0_blocks("layer", tiny)
