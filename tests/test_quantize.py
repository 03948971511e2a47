"""``nanoserve quantize`` and GPTQ, against references not written here.

- GPTQ (Cholesky form, lazy blocks) equals a plain sequential optimal-brain quantizer that
  re-solves the columns still free by least squares after each column is rounded: the same
  integers and scales, with damping matched by extra rows of ``X``;
- GPTQ's output error on calibration inputs is below RTN's, per random layer and on every
  linear of a random model;
- the written folder loads in transformers (compressed-tensors installed), and its weights as
  the compressed-tensors library decompresses them equal ``QuantizedWeight.dequantize``;
- bad requests are refused with the flag named.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanoserve.cli import main
from nanoserve.model.weights import load_model
from nanoserve.quantization.gptq import gptq
from nanoserve.quantization.rtn import quantize_rtn, round_to_grid, scales_and_zeros
from nanoserve.quantize.calibrate import calibration_windows, quantize_model
from nanoserve.quantize.command import add_arguments, recipe_of
from nanoserve.quantize.quality import layer_errors, perplexity, reference_model, relative_error
from nanoserve.quantize.recipe import Recipe
from nanoserve.quantize.write import hf_parts
from nanoserve.testing import write_hf_checkpoint
from nanoserve.tokenizer import Tokenizer

D = torch.float64


def obq_reference(w, X, bits, gs, symmetric):
    """Round column j to the grid (scales from the group's current weights when it starts),
    then re-solve columns > j exactly: min ||X W^T - X[:, :j+1] Q^T - X[:, j+1:] B^T||."""
    N, K = w.shape
    Y = X @ w.T  # (n, N): the outputs to keep
    cur, q = w.clone(), torch.empty(N, K, dtype=torch.int8)
    scales, zeros = [], []
    for j in range(K):
        if j % gs == 0:
            scale, zero = scales_and_zeros(cur[:, j:j + gs], bits, symmetric)
            scales.append(scale)
            zeros.append(zero)
        q[:, j] = round_to_grid(cur[:, j:j + 1], scale, zero, bits)[:, 0]
        cur[:, j] = (q[:, j].to(D) - (0 if zero is None else zero.to(D))) * scale.to(D)
        if j + 1 < K:
            rest = Y - X[:, :j + 1] @ cur[:, :j + 1].T
            cur[:, j + 1:] = torch.linalg.lstsq(X[:, j + 1:], rest).solution.T
    return q, torch.stack(scales, 1), None if zeros[0] is None else torch.stack(zeros, 1)


@pytest.mark.parametrize("bits,gs,block,symmetric,damp", [
    (4, 6, 128, True, 0.0), (4, 3, 2, True, 0.0), (4, 2, 4, False, 0.0), (8, 3, 4, True, 0.0),
    (4, 3, 2, False, 0.01), (4, 6, 1, True, 0.1)])
def test_gptq_equals_sequential_least_squares(bits, gs, block, symmetric, damp):
    g = torch.Generator().manual_seed(bits * 100 + gs * 10 + block)
    n, N, K = 40, 5, 6
    X = torch.randn(n, K, generator=g, dtype=D) @ torch.randn(K, K, generator=g, dtype=D)
    w = torch.randn(N, K, generator=g, dtype=D)
    H = 2 * X.T @ X / n
    qw = gptq(w, H, bits, gs, symmetric, damp=damp, block_size=block)
    lam = damp * torch.diag(H).mean()  # H + lam I  <=>  X with rows sqrt(lam n / 2) I added
    Xa = torch.cat([X, math.sqrt(lam * n / 2) * torch.eye(K, dtype=D)]) if damp else X
    q, scale, zero = obq_reference(w, Xa, bits, gs, symmetric)
    assert torch.equal(qw.q, q)
    torch.testing.assert_close(qw.scale, scale, rtol=1e-6, atol=0)
    assert (qw.zero is None) == (zero is None) and (zero is None or torch.equal(qw.zero, zero))


def test_gptq_dead_column_and_refusals():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 8, generator=g, dtype=D)
    X[:, 3] = 0  # an input that never fires
    w = torch.randn(4, 8, generator=g, dtype=D)
    qw = gptq(w, 2 * X.T @ X / 64, 4, 4, True)
    assert torch.isfinite(qw.scale).all() and (qw.q[:, 3] == 0).all()
    with pytest.raises(ValueError, match="group_size 3 does not divide the 8 inputs"):
        gptq(w, 2 * X.T @ X / 64, 4, 3, True)
    with pytest.raises(ValueError, match=r"Hessian is \(6, 6\)"):
        gptq(w, torch.eye(6, dtype=D), 4, 4, True)


@pytest.mark.parametrize("bits,gs,symmetric", [(4, 32, True), (4, None, False), (8, 16, True)])
def test_gptq_beats_rtn_on_random_layers(bits, gs, symmetric):
    g = torch.Generator().manual_seed(bits)
    X = torch.randn(512, 128, generator=g) @ torch.randn(128, 128, generator=g)  # correlated
    w = torch.randn(48, 128, generator=g)
    H = (2 * X.T @ X / len(X)).to(D)
    e_gptq = relative_error(w, gptq(w, H, bits, gs, symmetric).dequantize(), H)
    e_rtn = relative_error(w, quantize_rtn(w, bits, gs, symmetric).dequantize(), H)
    assert e_gptq < e_rtn
    direct = (X @ (w - gptq(w, H, bits, gs, symmetric).dequantize()).T).norm() / (X @ w.T).norm()
    assert math.isclose(e_gptq, float(direct), rel_tol=1e-4)


SHIPPED = Path(__file__).resolve().parents[1] / "nanoserve/checkpoints/nanoserve-tiny"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A random Llama with the shipped model's tokenizer (its vocabulary: 2048)."""
    path = write_hf_checkpoint(tmp_path_factory.mktemp("src"), "gqa", vocab_size=2048)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(SHIPPED / name, path / name)
    return path


def test_gptq_below_rtn_on_every_layer(src):
    model = load_model(src, dtype="float32")
    calib = torch.randint(0, model.cfg.vocab_size, (8, 32), generator=torch.Generator()
                          .manual_seed(0))
    for recipe in (Recipe("w4a16", group_size=16), Recipe.of("w8a8")):
        errors = layer_errors(model, recipe, calib)
        assert len(errors) == 4 * model.cfg.num_hidden_layers
        for name, e in errors.items():
            assert e["gptq"] < e["rtn"], (recipe.scheme, name, e)


def _library_weights(out):
    """Each quantized module's weight as compressed-tensors decompresses it from the folder."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig

    qc = QuantizationConfig.model_validate(
        json.loads((out / "config.json").read_text())["quantization_config"])
    scheme = qc.config_groups["group_0"]
    compressor = BaseCompressor.load_from_registry(qc.format)
    sd = load_file(out / "model.safetensors")
    prefixes = {k.rsplit(".", 1)[0] for k in sd if k.endswith(".weight_scale")}
    return {p: compressor.decompress({k[len(p) + 1:]: v for k, v in sd.items()
                                      if k.startswith(p + ".")}, scheme)["weight"]
            for p in prefixes}


@pytest.mark.parametrize("flags", [
    ["--scheme", "w4a16", "--group-size", "16", "--method", "gptq"],
    ["--scheme", "w8a16", "--group-size", "32", "--asymmetric", "--dtype", "float32"],
    ["--scheme", "w4a16", "--group-size", "channel", "--asymmetric"],
    ["--scheme", "w8a8", "--method", "gptq"],
])
def test_command_writes_what_the_library_and_transformers_read(src, tmp_path, flags):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    calib = tmp_path / "calib.txt"
    calib.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "out"
    assert main(["quantize", str(src), str(out), "--calibration", str(calib),
                 "--num-samples", "4", "--seq-len", "16", *flags]) == 0
    dtype = torch.float32 if "float32" in flags else torch.bfloat16
    # nanoserve's own numbers for the same run, fused names split back as the writer splits
    model = load_model(src, dtype="float32")
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([str(src), str(out), "--calibration", str(calib), *flags])
    windows = calibration_windows(Tokenizer.from_dir(src), calib.read_text(), 4, 16)
    quantized = quantize_model(model, recipe_of(args), windows)
    ours = {}
    for name, qw in quantized.items():
        for prefix, (start, length) in hf_parts(name, qw.shape[0], model.cfg).items():
            ours[prefix] = qw.narrow(0, start, length).to(scale_dtype=dtype).dequantize(dtype)
    library = _library_weights(out)
    assert set(library) == set(ours) and len(ours) == 7 * model.cfg.num_hidden_layers
    for prefix, w in library.items():
        assert w.dtype == dtype and torch.equal(w, ours[prefix]), prefix  # (scales in dtype)
    asym = "--asymmetric" in flags  # transformers' compressed path cannot init packed zero
    hf = AutoModelForCausalLM.from_pretrained(  # points (llm-compressor#1618): decompress
        out, quantization_config=CompressedTensorsConfig(dequantize=True)) if asym else \
        AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    if asym:
        for prefix, w in ours.items():
            assert torch.equal(hf.get_submodule(prefix).weight.to(dtype), w), prefix
    logits = hf(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["ignore"] == ["lm_head"]
    assert (out / "tokenizer.json").is_file()


@pytest.mark.parametrize("flags,message", [
    (["--scheme", "w3a16"], "scheme 'w3a16'; choose one of"),
    (["--scheme", "w4a16", "--method", "gptq"], "needs --calibration FILE"),
    (["--scheme", "w4a16", "--group-size", "0"], "group_size 0"),
    (["--scheme", "w4a16", "--method", "awq"], "method 'awq'"),
    (["--scheme", "w8a8", "--group-size", "32"], "w8a8: weights are symmetric"),
    (["--scheme", "w4a16", "--dtype", "int8"], "--dtype 'int8'"),
])
def test_refusals(src, tmp_path, capsys, flags, message):
    assert main(["quantize", str(src), str(tmp_path / "out"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_skipped_linears_are_ignored_and_perplexity_reads_any_model(src, tmp_path, caplog):
    out = tmp_path / "out"  # gqa: 64 inputs to qkv, o and gate_up, 128 to down: 128 skips 3
    assert main(["quantize", str(src), str(out), "--scheme", "w4a16", "--group-size", "128"]) == 0
    assert "does not divide the inputs of 6 linears" in caplog.text
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert ignore[0] == "lm_head" and len(ignore) == 1 + 2 * 6
    assert "model.layers.1.self_attn.k_proj" in ignore and "model.layers.1.mlp.up_proj" in ignore
    assert set(_library_weights(out)) == {f"model.layers.{i}.mlp.down_proj" for i in (0, 1)}
    model = load_model(src, dtype="float32")
    quantized = quantize_model(load_model(src, dtype="float32"), Recipe("w4a16", group_size=32))
    stream = torch.randint(0, model.cfg.vocab_size, (200,), generator=torch.Generator()
                           .manual_seed(1))
    dense = perplexity(model, stream, 32)
    ref = reference_model(model, quantized, dense_dtype=torch.bfloat16)
    assert math.isfinite(perplexity(ref, stream, 32)) and perplexity(ref, stream, 32) != dense
    assert perplexity(model, stream, 32, stride=48) > 0
    with pytest.raises(ValueError, match="overlap"):
        perplexity(model, stream, 32, stride=16)
