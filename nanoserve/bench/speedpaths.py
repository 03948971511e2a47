"""The speed paths' numbers: what each one saves, counted where it can be and timed where not.

Why this module exists: the fast paths (packed prefill, the gathered mapping, compiled decode,
bf16 on a CPU) each claim a saving, and each claim needs one command that remakes it. Counts
(positions computed, workspace bytes, logit error) are exact; times are always two arms stepped
alternately in one process on the same checkpoint, reported as a ratio, because a shared CPU's
absolute times drift by a factor of several within minutes.

    python -m nanoserve.bench.speedpaths positions     # packed vs padded prefill, positions
    python -m nanoserve.bench.speedpaths workspace     # decode read bytes, ragged batches
    python -m nanoserve.bench.speedpaths bf16          # bf16 logit error against transformers
    python -m nanoserve.bench.speedpaths decode --arms gathered reference [--dtype float32]
    python -m nanoserve.bench.speedpaths decode --arms compile gathered
    python -m nanoserve.bench.speedpaths decode --arms gathered reference --ragged
    python -m nanoserve.bench.speedpaths decode --arms packed plain --threads 1
    python -m nanoserve.bench.speedpaths linear --rows 8 --threads 1   # packed weights, one call
    python -m nanoserve.bench.speedpaths profile --dtype bfloat16     # top ops, before/after
    python -m nanoserve.bench.speedpaths pages --dtype bfloat16       # 2 MiB vs 4 KiB pages
    python -m nanoserve.bench.speedpaths prefill --dtype bfloat16     # prompts: kernel vs SDPA
    python -m nanoserve.bench.speedpaths layers --dtype bfloat16      # decode_layers vs Python

``decode`` uses random weights in SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads, 3 KV
heads, intermediate 1536, vocab 49152, tied), written by transformers (a test dependency), 32
running requests, and reports each arm's step time and its host share: the step's time outside
the model forward and the LM head (scheduling, ids, positions, cells, the mapping, sampling).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

SMOLLM2_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                    max_position_embeddings=4096, initializer_range=0.02)


def positions() -> None:
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams
    prompts = [list(range(2, 2 + n)) for n in (5, 12, 40, 3, 90, 17, 8, 60)]
    for policy in ("packed", "padded"):
        llm = LLM(dtype="float32", prefill=policy, max_num_seqs=8)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        s = llm.stats
        print(f"prefill={policy}: 8 prompts of 3..90 tokens, positions computed "
              f"{s.positions_computed}, real tokens {s.tokens_computed}")


def workspace() -> None:
    from nanoserve.attention.selector import workspace_bytes
    for name, lens in [("one of 2000 + 31 of 50", [2000] + [50] * 31),
                       ("32 of 16..202", list(range(16, 208, 6))), ("32 of 512", [512] * 32)]:
        r, g = (workspace_bytes(p, lens, 9, 3, 64, 2) for p in ("reference", "gathered"))
        print(f"{name}: reference {r / 2**20:.2f} MiB, gathered {g / 2**20:.2f} MiB per layer "
              f"(bf16, 9/3 heads, D=64), reference/gathered {r / g:.1f}x")


def bf16() -> None:
    from nanoserve.model.weights import load_model
    from nanoserve.testing import load_hf_model, relative_logit_error, write_hf_checkpoint
    for name, shape in [("tiny gqa", ("gqa", {})), ("SmolLM2-135M shape", ("tied", SMOLLM2_135M))]:
        d = write_hf_checkpoint(tempfile.mkdtemp(), shape[0], **shape[1])
        vocab = shape[1].get("vocab_size", 256)
        ids = torch.randint(1, vocab - 1, (1, 64), generator=torch.Generator().manual_seed(0))
        ref = load_hf_model(d)
        with torch.no_grad():
            want = ref(ids).logits[0]
            hf16 = ref.to(torch.bfloat16)(ids).logits[0].float()
            ours = load_model(d, "bfloat16")
            got = ours.compute_logits(ours(ids, torch.arange(64)[None]))[0]
        def agree(x, want=want):
            return (x.argmax(-1) == want.argmax(-1)).float().mean().item()
        print(f"{name}, 64 tokens: ours bf16 vs HF fp32 {relative_logit_error(got, want):.4f} "
              f"(argmax agrees {agree(got):.0%}); HF bf16 vs HF fp32 "
              f"{relative_logit_error(hf16, want):.4f} (argmax {agree(hf16):.0%})")


def decode(arms: list[str], dtype: str, steps: int, ragged: bool) -> None:
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams
    from nanoserve.testing import write_hf_checkpoint
    d = write_hf_checkpoint(tempfile.mkdtemp(), "tied", **SMOLLM2_135M)
    g = torch.Generator().manual_seed(0)
    lens = ([1500] + torch.randint(20, 60, (31,), generator=g).tolist() if ragged else
            torch.randint(16, 200, (32,), generator=g).tolist())
    prompts = [torch.randint(2, 49000, (n,), generator=g).tolist() for n in lens]
    params = SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True)
    llms, model_s = [], {}
    for arm in arms:
        kw = {"compile": dict(compile=True), "packed": dict(prepack=True),
              "plain": dict(prepack=False)}.get(arm, dict(attention=arm))
        llm = LLM(d, dtype=dtype, skip_tokenizer_init=True, max_num_seqs=32, **kw)
        acc = model_s[arm] = [0.0]

        def timed(f, acc=acc):
            def run(*a, **k):
                t = time.perf_counter()
                out = f(*a, **k)
                acc[0] += time.perf_counter() - t
                return out
            return run
        if llm.engine.compiled is not None:
            llm.engine.compiled.fn = timed(llm.engine.compiled.fn)
        else:
            llm.model.forward = timed(llm.model.forward)
            llm.model.compute_logits = timed(llm.model.compute_logits)
        for i, p in enumerate(prompts):
            llm.core.add(llm.core.make_request(f"r{i}", p, params))
        llms.append(llm)
    rec: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
    with torch.inference_mode():
        for llm in llms:
            llm.core.step()  # the prefill of all 32
            llm.core.step()  # the first decode (compile's warm-up lands here)
        for _ in range(steps):
            for arm, llm in zip(arms, llms, strict=True):
                model_s[arm][0] = 0.0
                t = time.perf_counter()
                llm.core.step()
                rec[arm].append((time.perf_counter() - t, model_s[arm][0]))
    shape = "1 of 1500 + 31 of 20..60" if ragged else "32 of 16..200"
    print(f"decode, SmolLM2-135M shape (random), {dtype}, 32 running ({shape} prompt tokens), "
          f"{steps} alternating steps per arm:")
    for arm, llm in zip(arms, llms, strict=True):
        step = statistics.median(s for s, _ in rec[arm])
        host = sum(s - m for s, m in rec[arm]) / sum(s for s, _ in rec[arm])
        c = llm.engine.compiled
        extra = f"; {c.compiles} compile(s), warm-up {c.warmup_s:.1f} s" if c else ""
        print(f"  {arm:9s} step {step * 1e3:7.1f} ms (median), host share {host:.1%}{extra}")
    a, b = (statistics.median(s for s, _ in rec[x]) for x in arms[:2])
    print(f"  {arms[0]}/{arms[1]} step time: {a / b:.2f}")


def linear(rows: int, dtype: str) -> None:
    """One SmolLM2-135M layer's projections and the LM head: F.linear vs the packed weight."""
    from nanoserve.layers.linear_onednn import packed_layer
    dt = getattr(torch, dtype)
    E, inter, V = SMOLLM2_135M["hidden_size"], SMOLLM2_135M["intermediate_size"], 49152
    shapes = {"qkv 576->960": (E, 960), "o 576->576": (E, E), "gate_up 576->3072": (E, 2 * inter),
              "down 1536->576": (inter, E), "lm head 576->49152": (E, V)}
    print(f"linear, {rows} rows, {dtype}, {torch.get_num_threads()} thread(s), best of 5 "
          f"rounds (us per call):")
    for name, (k, n) in shapes.items():
        w, x = torch.randn(n, k, dtype=dt), torch.randn(rows, k, dtype=dt)
        packed = packed_layer(w)
        calls = 20 if n > 10_000 else 200
        best = {"F.linear": 1e9, "packed": 1e9}
        with torch.inference_mode():
            same = torch.equal(torch.nn.functional.linear(x, w), packed(x))
            for _ in range(5):
                for arm, f, args in (("F.linear", torch.nn.functional.linear, (x, w)),
                                     ("packed", packed, (x,))):
                    f(*args)
                    t = time.perf_counter()
                    for _ in range(calls):
                        f(*args)
                    best[arm] = min(best[arm], (time.perf_counter() - t) / calls)
        print(f"  {name:20s} F.linear {best['F.linear'] * 1e6:8.0f}  packed "
              f"{best['packed'] * 1e6:8.0f}  ({best['F.linear'] / best['packed']:.2f}x, "
              f"{'bit-identical' if same else 'not bit-identical'})")


def profile(dtype: str, steps: int, top: int) -> None:
    """One thread, 8 rows of the SmolLM2-135M shape decoding: the ops' self CPU time over
    ``steps`` decode steps under torch.profiler, the PyTorch path (kernels off, the gathered
    read) against the default path, each arm's ``top`` ops with their share of the total."""
    from collections import Counter

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from nanoserve.bench.shapes import shape_checkpoint
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    torch.set_num_threads(1)
    arms = {"before (kernels=False, attention=gathered)": dict(kernels=False,
                                                                attention="gathered"),
            "after (the defaults)": {}}
    g = torch.Generator().manual_seed(54)
    prompts = [torch.randint(2, 49000, (32 + 4 * i,), generator=g).tolist() for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
    print(f"profile, SmolLM2-135M shape (random), {dtype}, 8 rows, one thread, {steps} decode "
          f"steps per arm, self CPU time by op:")
    for name, kw in arms.items():
        llm = LLM(str(shape_checkpoint("smollm2-135m")), dtype=dtype, skip_tokenizer_init=True,
                  max_num_seqs=8, max_model_len=512, **kw)
        for i, p in enumerate(prompts):
            llm.core.add(llm.core.make_request(f"r{i}", p, params))
        with torch.inference_mode():
            llm.core.step()  # the prefill
            llm.core.step()  # the first decode step
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    llm.core.step()
        self_us, calls = Counter(), Counter()
        for e in prof.key_averages():
            self_us[e.key] += e.self_cpu_time_total
            calls[e.key] += e.count
        total = sum(self_us.values())
        print(f"  {name}: {total / steps / 1e3:.2f} ms of op time a step")
        for op, us in self_us.most_common(top):
            print(f"    {op:40s} {us / total:6.1%}  {calls[op] // steps:5d} calls a step")


def _paired(arms: dict, pairs: int) -> dict[str, list[float]]:
    """Each arm's time in seconds, ``pairs`` times: the two arms run back to back, the order
    swapped every pair, so that a burst of load on a shared machine hits both alike and the
    i-th times of the two arms make a pair."""
    (a, fa), (b, fb) = arms.items()
    times: dict[str, list[float]] = {a: [], b: []}
    for i in range(pairs):
        for name, f in ((a, fa), (b, fb)) if i % 2 else ((b, fb), (a, fa)):
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    return times


def pages(dtype: str, pairs: int) -> None:
    """One thread, 8 rows: the decode step's small-M linears of the SmolLM2-135M shape (every
    layer's own weights, then the LM head) streamed from their copies on 2 MiB pages (the
    default, ``huge_pages.py``) and from plain clones on 4 KiB pages, alternately, ``pairs``
    times; the median of the paired ratios, with the 10th and 90th percentiles."""
    from nanoserve.bench.shapes import shape_checkpoint
    from nanoserve.layers.linear_methods import small_copies
    from nanoserve.llm import LLM

    torch.set_num_threads(1)
    llm = LLM(str(shape_checkpoint("smollm2-135m")), dtype=dtype, skip_tokenizer_init=True,
              max_num_seqs=8, max_model_len=512)
    owners = small_copies(llm.model)
    if not owners:
        print(f"pages: no small-M weights here ({llm.kernels_reason}; {llm.prepack_reason})")
        return
    huge = [m.small for m in owners]
    plain = [t.clone() for t in huge]  # torch's allocator: 64-byte aligned, no advice
    xs = [torch.randn(8, m.in_features, dtype=llm.dtype) for m in owners]
    outs = [torch.empty(8, m.out_features, dtype=llm.dtype) for m in owners]

    def stream(weights) -> None:
        for m, w, x, out in zip(owners, weights, xs, outs, strict=True):
            torch.ops.nanoserve.small_gemm(out, x, w, m.bias)

    stream(huge), stream(plain)
    times = _paired({"huge": lambda: stream(huge), "plain": lambda: stream(plain)}, pairs)
    ratios = sorted(p / h for p, h in zip(times["plain"], times["huge"], strict=True))
    total = sum(t.numel() * t.element_size() for t in huge)
    print(f"pages, SmolLM2-135M shape (random), {dtype}, 8 rows, one thread, {len(owners)} "
          f"small-M linears a step ({total / 1e6:.1f} MB), {pairs} alternating pairs:")
    print(f"  {llm.model.huge_pages}")
    for arm in ("plain", "huge"):
        med = statistics.median(times[arm])
        print(f"  {arm:5s} pages: median {med * 1e3:.2f} ms a step, {total / med / 1e9:.1f} GB/s")
    print(f"  4 KiB / 2 MiB time, paired: median {statistics.median(ratios):.3f}x "
          f"(10th percentile {ratios[len(ratios) // 10]:.3f}x, 90th "
          f"{ratios[len(ratios) * 9 // 10]:.3f}x)")


def prefill(dtype: str, pairs: int) -> None:
    """One thread: one prompt's causal attention, SmolLM2-135M's heads (9 over 3 KV heads of
    64), as ``packed_prefill_attention`` runs it (SDPA on views of the qkv output) and through
    the decode kernel (``nanoserve.cpu.prefill``, K/V in the pool's scattered blocks),
    alternately."""
    import torch.nn.functional as F

    from nanoserve.attention.causal import packed_prefill_attention
    from nanoserve.cpu import csrc
    from nanoserve.cpu.prefill import attend_prompts, token_tables

    why = csrc.load()
    if why:
        print(f"prefill: the C++ ops are unavailable: {why}")
        return
    torch.set_num_threads(1)
    dt, (Hq, Hkv, D), bs = getattr(torch, dtype), (9, 3, 64), 16
    g = torch.Generator().manual_seed(55)
    print(f"prefill, {dtype}, one thread, {Hq} query heads over {Hkv} KV heads of {D}, block "
          f"size {bs}, {pairs} alternating pairs (us per prompt per layer):")
    for T in (32, 104, 192):
        qkv = torch.randn(1, T, (Hq + 2 * Hkv) * D, generator=g).to(dt)  # (1, T, (Hq+2Hkv) D)
        q, k, v = (qkv[..., a * D:b * D].view(1, T, b - a, D).transpose(1, 2)
                   for a, b in ((0, Hq), (Hq, Hq + Hkv), (Hq + Hkv, Hq + 2 * Hkv)))
        blocks = torch.randperm(64, generator=g)[:-(-T // bs)]  # scattered, as the pool's are
        cells = (blocks[:, None] * bs + torch.arange(bs)).reshape(-1)[:T]
        kp, vp = torch.zeros(64 * bs, Hkv, D, dtype=dt), torch.zeros(64 * bs, Hkv, D, dtype=dt)
        kp[cells], vp[cells] = k[0].transpose(0, 1), v[0].transpose(0, 1)
        tables, ctx = token_tables(cells, [T], [True], bs)
        arms = {"sdpa": lambda q=q, k=k, v=v, T=T: packed_prefill_attention(q, k, v, [T]),
                "kernel": lambda q=q, kp=kp, vp=vp, tables=tables, ctx=ctx:
                    attend_prompts(q, kp, vp, tables, ctx, bs)}
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                              enable_gqa=True)
        err = {a: (f().double() - want).abs().max().item() for a, f in arms.items()}
        times = _paired(arms, pairs)
        ratio = statistics.median(s / k for s, k in zip(times["sdpa"], times["kernel"],
                                                        strict=True))
        flops = T * T * Hq * D * 2  # causal: half of T^2 (q.k and p.v, 2 flops each)
        med = {a: statistics.median(t) for a, t in times.items()}
        print(f"  {T:4d} tokens: sdpa {med['sdpa'] * 1e6:7.0f} ({flops / med['sdpa'] / 1e9:3.0f} "
              f"GFLOP/s)  kernel {med['kernel'] * 1e6:7.0f} ({flops / med['kernel'] / 1e9:3.0f} "
              f"GFLOP/s)  sdpa/kernel {ratio:.2f}x paired; max error against float64: sdpa "
              f"{err['sdpa']:.1e}, kernel {err['kernel']:.1e}")


def layers(dtype: str, pairs: int) -> None:
    """One thread, 8 rows of the SmolLM2-135M shape decoding (prompts of 40 to 96 tokens): whole
    engine steps with the layer loop as one C++ op (``decode_layers``) and with fused.py's
    Python loop, alternately, ``pairs`` times; the median step of each and of their ratio."""
    from nanoserve.bench.shapes import shape_checkpoint
    from nanoserve.layers.linear_methods import linears
    from nanoserve.llm import LLM
    from nanoserve.sampling.params import SamplingParams

    torch.set_num_threads(1)
    llm = LLM(str(shape_checkpoint("smollm2-135m")), dtype=dtype, skip_tokenizer_init=True,
              max_num_seqs=8, max_model_len=512)
    loop = llm.model.decode_layer_weights  # None: some linear has no small-M copy here
    if loop is None:
        methods = sorted({m.method.describe() for m in linears(llm.model)})
        print(f"layers: the loop does not qualify here ({llm.kernels_reason}; "
              f"{llm.prepack_reason}; linear methods: {'; '.join(methods)})")
        return
    g = torch.Generator().manual_seed(49)
    params = SamplingParams(temperature=0, max_tokens=2 * pairs + 8, ignore_eos=True)
    for i in range(8):
        prompt = torch.randint(2, 49000, (40 + 8 * i,), generator=g).tolist()
        llm.core.add(llm.core.make_request(f"r{i}", prompt, params))

    def step(weights) -> None:  # without the loop's weights, the forward runs its Python loop
        llm.model.decode_layer_weights = weights
        llm.core.step()

    try:
        with torch.inference_mode():
            llm.core.step()  # the prefill
            llm.core.step()
            times = _paired({"op": lambda: step(loop), "python": lambda: step(None)}, pairs)
    finally:
        llm.model.decode_layer_weights = loop
    ratio = statistics.median(p / o for p, o in zip(times["python"], times["op"], strict=True))
    print(f"layers, SmolLM2-135M shape (random), {dtype}, 8 rows, one thread, {pairs} "
          f"alternating pairs of decode steps: Python loop "
          f"{statistics.median(times['python']) * 1e3:.2f} ms, decode_layers "
          f"{statistics.median(times['op']) * 1e3:.2f} ms a step; python/op {ratio:.3f}x paired")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m nanoserve.bench.speedpaths")
    p.add_argument("what", choices=["positions", "workspace", "bf16", "decode", "linear",
                                    "profile", "pages", "prefill", "layers"])
    p.add_argument("--arms", nargs=2, default=["gathered", "reference"],
                   help="two of: gathered, reference, compile, packed, plain")
    p.add_argument("--rows", type=int, default=8, help="linear: rows per call")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--ragged", action="store_true", help="one long request among short ones")
    p.add_argument("--top", type=int, default=10, help="profile: ops listed per arm")
    p.add_argument("--pairs", type=int, default=100,
                   help="pages, prefill, layers: alternating pairs timed")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.what == "linear":
        linear(a.rows, a.dtype)
    elif a.what == "profile":
        profile(a.dtype, a.steps, a.top)
    elif a.what == "pages":
        pages(a.dtype, a.pairs)
    elif a.what == "prefill":
        prefill(a.dtype, a.pairs)
    elif a.what == "layers":
        layers(a.dtype, a.pairs)
    elif a.what == "decode":
        decode(a.arms, a.dtype, a.steps, a.ragged)
    else:
        {"positions": positions, "workspace": workspace, "bf16": bf16}[a.what]()


if __name__ == "__main__":
    main()
