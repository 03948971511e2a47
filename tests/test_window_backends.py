"""A sliding window on every attention backend: a backend that ignores it fails here.

Mistral checkpoints written by transformers' own ``MistralForCausalLM`` (float32), windows of 5
and 8 tokens, prompts of 3, 7 and 13 tokens and 8 greedy steps, so one prompt fits its window,
the others do not, and every row's decode crosses it. Each backend in the registry that runs
here (``reference``, ``gathered``, ``cpu`` where the C++ ops build, ``triton`` under the
interpreter where triton is installed) serves all three prompts at once:

- *whole*: every prompt a fresh prompt of one packed step, then decode rows;
- *chunked*: a budget of 6 tokens a step, so the long prompts arrive as a fresh chunk and then
  continued chunks, with decode rows riding along them (mixed steps);

block sizes 4 and 5, one dividing the window and one not, and head_dim 32 over hidden/heads 16
on one checkpoint. Every sampled token's logits are held to transformers' and to the reference
backend's within 1e-5, and the greedy tokens are identical. A backend whose windows are taken
away misses by far more. Graph windows (Day 57, eager replay here) replay the windowed decode on
each backend (captured on a card: the ``gpu`` test), and the fused decode loop
(``decode_layers``) with windows is fused.py's loop to the bit. The kernels themselves are held
to their PyTorch references over random windows in ``test_window_kernels.py``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from nanoserve import LLM, SamplingParams
from nanoserve.config import ATTENTION_PATHS
from nanoserve.cpu import csrc, fused
from nanoserve.engine import engine as engine_mod
from nanoserve.testing import hf_greedy

PROMPTS = [[5, 17, 3], [200, 7, 7, 1, 64, 80, 31], [9, 150, 4, 77, 11, 22, 33, 44, 1, 2, 3, 250, 6]]
STEPS = 8
BOUND = 1e-5
PATHS = {"whole": {}, "chunked": {"max_num_batched_tokens": 6, "max_num_seqs": 3}}
# (checkpoint, window, block size, path): each window with a block size that divides it and
# one that does not, each on both paths
CASES = [("gqa", 5, 4, "chunked"), ("gqa", 5, 5, "whole"), ("head_dim", 8, 4, "whole"),
         ("head_dim", 8, 5, "chunked")]


def runnable(name: str) -> str | None:
    """Why backend ``name`` does not run here, or None."""
    if name == "cpu" and csrc.load() is not None:
        return f"the C++ ops: {csrc.load()}"
    if name == "triton" and importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


BACKENDS = [pytest.param(n, marks=pytest.mark.skipif(runnable(n) is not None,
                                                     reason=str(runnable(n))))
            for n in ATTENTION_PATHS]


@pytest.fixture(scope="module")
def checkpoints(hf_checkpoint):
    return lambda name, window: hf_checkpoint(name, family="mistral", sliding_window=window)


_expected: dict = {}


def transformers_greedy(path, prompts=PROMPTS) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Each prompt's greedy tokens and every step's logits, by transformers (cached)."""
    key = (path, tuple(map(tuple, prompts)))
    if key not in _expected:
        _expected[key] = hf_greedy(path, prompts, STEPS)
    return _expected[key]


def serve(path, attention: str, block_size: int, path_kw: dict, monkeypatch, prompts=PROMPTS,
          keep_blocks: bool = False,
          **kw) -> tuple[list[list[int]], list[list[torch.Tensor]], LLM]:
    """All prompts through one engine: each prompt's tokens and the logits each was sampled
    from (recorded where the engine samples, whatever step kind produced them; a preempted
    request's recomputed steps are recorded again)."""
    seen: dict[tuple, list[torch.Tensor]] = {tuple(p): [] for p in prompts}
    real = engine_mod.sample_requests

    def recording(logits, requests):
        for r, row in zip(requests, logits, strict=True):
            seen[tuple(r.prompt_token_ids)].append(row.float().cpu())
        return real(logits, requests)

    monkeypatch.setattr(engine_mod, "sample_requests", recording)
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, attention=attention,
              kernels=attention == "cpu", block_size=block_size, max_model_len=64,
              **path_kw, **kw)
    if keep_blocks:  # a pool that keeps blocks behind the window, so a small one preempts
        llm.core.keep_window_blocks()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=STEPS,
                                                ignore_eos=True))
    monkeypatch.setattr(engine_mod, "sample_requests", real)
    kv = llm.core.scheduler.kv_cache_manager
    assert kv.num_free == kv.num_blocks  # every block back in the pool after the drain
    return [o.token_ids for o in outs], [seen[tuple(p)] for p in prompts], llm


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


_reference_runs: dict = {}


@pytest.mark.parametrize("name,window,bs,path", CASES,
                         ids=[f"{n}-w{w}-bs{b}-{p}" for n, w, b, p in CASES])
@pytest.mark.parametrize("attention", BACKENDS)
def test_every_backend_reads_the_window(checkpoints, monkeypatch, attention, name, window, bs,
                                        path):
    ckpt = checkpoints(name, window)
    expected = transformers_greedy(ckpt)
    key = (name, window, bs, path)
    if key not in _reference_runs:
        _reference_runs[key] = serve(ckpt, "reference", bs, PATHS[path], monkeypatch)[:2]
    ref_tokens, ref_logits = _reference_runs[key]
    tokens, logits, llm = serve(ckpt, attention, bs, PATHS[path], monkeypatch)
    assert llm.engine.cache.attention == attention
    for i, (want_tokens, want_logits) in enumerate(expected):
        assert tokens[i] == want_tokens == ref_tokens[i]
        diff = max_diff(logits[i], want_logits)
        assert diff <= BOUND, f"{attention}: prompt {i}: |logits - transformers| {diff:.2e}"
        assert max_diff(logits[i], ref_logits[i]) <= BOUND


@pytest.mark.parametrize("attention", BACKENDS)
def test_a_backend_without_its_windows_misses(checkpoints, monkeypatch, attention):
    """The same engine with its layers' windows taken from the backend (and from the fused
    loop's weights) after load: the logits move far past the bound, so the test above would
    catch a backend that ignored them."""
    ckpt = checkpoints("gqa", 5)
    expected = transformers_greedy(ckpt)
    real_init = LLM.__init__

    def without_windows(self, *a, **k):
        real_init(self, *a, **k)
        backend = self.engine.cache.backend
        backend.windows = (None,) * len(backend.windows)
        if self.model.decode_layer_weights is not None:
            self.model.decode_layer_weights["windows"] = None

    monkeypatch.setattr(LLM, "__init__", without_windows)
    _, logits, _ = serve(ckpt, attention, 4, PATHS["chunked"], monkeypatch)
    assert max_diff(logits[2], expected[2][1]) > 1e-3  # 13 tokens, a window of 5


SHARED = [9, 150, 4, 77, 11, 22, 33, 44, 1]  # two full blocks of 4 and one token
PREFIXED = [[*SHARED, 2, 3], [*SHARED, 5, 6, 7, 8], [*SHARED, 250]]


@pytest.mark.parametrize("attention", BACKENDS)
def test_prefix_hits_and_preemption_keep_the_window(checkpoints, monkeypatch, attention):
    """Prompts that share two cached blocks (a prefix hit: the rest is a continued chunk) in a
    pool too small for two rows at once (preemption, then recompute): transformers' tokens.
    The pool keeps the blocks the window passed (with them given back, as by default, the
    same pool never runs dry: the second run)."""
    ckpt = checkpoints("gqa", 5)
    expected = [t for t, _ in transformers_greedy(ckpt, PREFIXED)]
    for keep, preempts in ((True, True), (False, False)):
        tokens, _, llm = serve(ckpt, attention, 4, {"max_num_seqs": 2}, monkeypatch, PREFIXED,
                               keep_blocks=keep, enable_prefix_caching=True, num_kv_blocks=7)
        assert llm.stats.prefix_cache_hits > 0
        assert (llm.stats.preemptions > 0) == preempts
        assert tokens == expected


@pytest.mark.parametrize("attention", BACKENDS)
def test_graph_windows_replay_the_window(checkpoints, monkeypatch, attention):
    """cuda_graphs=True (eager replay without a card): the decode steps replay a recorded
    window, whose read takes each layer's window; tokens and logits as transformers'."""
    ckpt = checkpoints("gqa", 5)
    expected = transformers_greedy(ckpt)
    tokens, logits, llm = serve(ckpt, attention, 4, PATHS["whole"], monkeypatch,
                                cuda_graphs=True)
    assert llm.engine.graphs is not None and llm.engine.replay_counters.replayed > 0
    for i, (want_tokens, want_logits) in enumerate(expected):
        assert tokens[i] == want_tokens
        assert max_diff(logits[i], want_logits) <= BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["triton", "gathered"])
def test_captured_graph_windows_read_the_window_on_a_card(checkpoints, monkeypatch, attention):
    """On a card: the compiled Triton kernel (or the gathered read) in captured CUDA graphs,
    chunked prefill around them; tokens as transformers', logits within float32's reordering
    on a GPU."""
    ckpt = checkpoints("gqa", 5)
    expected = transformers_greedy(ckpt)
    tokens, logits, llm = serve(ckpt, attention, 4, PATHS["chunked"], monkeypatch,
                                device="cuda", cuda_graphs=True)
    assert llm.engine.graphs.mode == "cuda graphs" and llm.engine.replay_counters.replayed > 0
    for i, (want_tokens, want_logits) in enumerate(expected):
        assert tokens[i] == want_tokens
        assert max_diff(logits[i], want_logits) <= 1e-4


@pytest.fixture
def small_everywhere(monkeypatch):
    """Every packed shape takes the small-M kernel up to 8 rows, so the loop qualifies."""
    from nanoserve.cpu import small_gemm

    monkeypatch.setattr(small_gemm, "choose", lambda N, K, dtype=torch.bfloat16, against="onednn":
                        0 if small_gemm.unavailable(dtype) else 8)


@pytest.mark.skipif(runnable("cpu") is not None, reason=str(runnable("cpu")))
def test_the_fused_decode_loop_reads_each_layers_window(checkpoints, monkeypatch,
                                                        small_everywhere):
    """kernels on: the decode steps run ``decode_layers`` with the layers' windows, its logits
    fused.py's own loop's to the bit, and transformers' within the bound."""
    if not torch.ops.nanoserve.small_gemm_f32_available():
        pytest.skip("no float32 small-M kernel on this CPU")
    ckpt = checkpoints("gqa", 5)
    expected = transformers_greedy(ckpt)
    real_loop, calls = fused._decode_layers, []
    monkeypatch.setattr(fused, "_decode_layers", lambda *a: None)
    want_tokens, want_logits, llm = serve(ckpt, "cpu", 4, PATHS["whole"], monkeypatch,
                                          prepack="auto")
    assert llm.model.decode_layer_weights["windows"] == [5, 5]
    monkeypatch.setattr(fused, "_decode_layers",
                        lambda *a: calls.append(real_loop(*a)) or calls[-1])
    tokens, logits, _ = serve(ckpt, "cpu", 4, PATHS["whole"], monkeypatch, prepack="auto")
    assert sum(c is not None for c in calls) > 0  # the op ran decode steps
    assert tokens == want_tokens == [t for t, _ in expected]
    for got, want, (_, hf) in zip(logits, want_logits, expected, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert max_diff(got, hf) <= BOUND
