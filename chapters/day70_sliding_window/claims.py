"""Day 70's numbers: what a sliding window lets a paged pool give back, and what it keeps.

The generation rows run ``nanoserve.bench.window_pool`` (``measure``) at its defaults: a
random 2-layer ``MistralForCausalLM`` written by transformers (window 64 on both layers), a
32-token prompt and 480 greedy new tokens in blocks of 16, float32, once with the blocks behind
the window given back and once with every block kept, on the reference and the gathered
backends. ``poisoned`` runs a shorter request (32 + 160 tokens) on the same checkpoint, reads
the null block's cells after it, then fills them with finite junk and with NaN and runs it
again; ``trace`` (for the figure and the notebook) records the blocks held after every step.
The configuration rows read the families' own ``served_windows`` on config dicts (the
Gemma-3-270M shape is ``nanoserve.bench.shapes``'); the hybrid shares are arithmetic on those
windows. The rule rows hold the frozen snapshot against ``nanoserve.engine.kv_manager`` and the
prefix cache's ``match_window`` on a hand-made pool. Nothing is timed.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from pathlib import Path

from chapters.common import one_thread
from chapters.runner import exact

from .snapshot import window_blocks as frozen

WINDOW, BLOCK, PROMPT_LEN, NEW = 64, 16, 32, 480  # the bench's defaults
CONTEXT = 32768  # the Gemma-3-270M shape's max_position_embeddings


@functools.cache
def checkpoint() -> Path:
    from nanoserve.bench.window_pool import write_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="nanoserve-day70-"))
    return write_checkpoint(tmp, WINDOW, PROMPT_LEN + NEW)


def prompt() -> list[int]:
    import torch

    g = torch.Generator().manual_seed(0)  # the bench's prompt
    return torch.randint(1, 255, (PROMPT_LEN,), generator=g).tolist()


@functools.cache
def bench(attention: str) -> dict:
    """The bench's two runs (freeing, keeping) on one backend, on the shared checkpoint."""
    from nanoserve.bench.window_pool import measure

    with one_thread():  # a 2-layer model of hidden size 64: a second thread only waits
        return measure(PROMPT_LEN, NEW, BLOCK, WINDOW, attention, path=checkpoint())


@functools.cache
def trace(attention: str = "reference", free: bool = True, new: int = NEW) -> dict:
    """One request step by step: blocks held after each step, where the request's next query
    stands, and whether the null block still holds the cache's zeros at the end."""
    import torch

    from nanoserve.config import EngineConfig
    from nanoserve.engine.kv_manager import NULL_BLOCK
    from nanoserve.loader import load_core
    from nanoserve.sampling.params import SamplingParams

    core = load_core(EngineConfig(model=checkpoint(), dtype="float32", skip_tokenizer_init=True,
                                  kernels=False, block_size=BLOCK, max_num_seqs=2,
                                  max_model_len=PROMPT_LEN + new, attention=attention))
    if not free:
        core.keep_window_blocks()
    core.add_request("long", prompt(), SamplingParams(temperature=0, max_tokens=new,
                                                       ignore_eos=True))
    held, tokens = [], []
    with torch.inference_mode(), one_thread():
        while core.has_unfinished():
            for d in core.step():
                tokens += d.new_token_ids
            snap = core.snapshot()
            held.append(snap.num_blocks - snap.num_free_blocks)
    core.release_finished()
    core.check_drained()
    cache = core.engine.cache
    cells = slice(NULL_BLOCK * BLOCK, (NULL_BLOCK + 1) * BLOCK)
    zeros = not (cache.k[:, cells].any() or cache.v[:, cells].any())
    return {"held": held, "tokens": tokens, "null_zeros": zeros,
            "freed": core.scheduler.kv_cache_manager.window_freed}


def peaks(attention: str) -> str:
    b = bench(attention)
    return f"{b['peak_blocks_freeing']} against {b['peak_blocks_keeping']}"


def given_back() -> str:
    ref, gat = bench("reference")["blocks_given_back"], bench("gathered")["blocks_given_back"]
    return f"{ref} on both backends" if ref == gat else f"{ref} and {gat}"


def identical() -> str:
    same = all(bench(a)["identical_text"] for a in ("reference", "gathered"))
    return "yes, on both backends" if same else "no"


def pool_sizes() -> str:
    u = bench("reference")["usable_blocks"]
    return f"{u['keeping']} blocks, {u['freeing']} usable"


def most_blocks_seen() -> str:
    """The most blocks any query of the run reads, by enumeration, beside the formula."""
    seen = max(len(frozen.visible_blocks(i, WINDOW, BLOCK)) for i in range(PROMPT_LEN + NEW))
    return f"{seen}, as ceil((w − 1) / bs) + 1 = {frozen.most_visible(WINDOW, BLOCK)}"


@functools.cache
def poisoned(attention: str = "reference", new: int = 160) -> dict:
    """The same request three times on one engine: clean (then block 0 is read back: still
    the cache's zeros?), then with the null block's cells set to finite junk, then to NaN.
    Does the text change?"""
    from nanoserve import LLM, SamplingParams
    from nanoserve.engine.kv_manager import NULL_BLOCK

    llm = LLM(str(checkpoint()), dtype="float32", skip_tokenizer_init=True, kernels=False,
              block_size=BLOCK, max_num_seqs=2, attention=attention)
    sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    cache, cells = llm.core.engine.cache, slice(NULL_BLOCK * BLOCK, (NULL_BLOCK + 1) * BLOCK)
    with one_thread():
        clean = llm.generate([prompt()], sp)[0].token_ids
        zeros = not (cache.k[:, cells].any() or cache.v[:, cells].any())
        freed = llm.core.scheduler.kv_cache_manager.window_freed
        cache.k[:, cells], cache.v[:, cells] = 1e4, -1e4
        junk = llm.generate([prompt()], sp)[0].token_ids
        cache.k[:, cells] = cache.v[:, cells] = float("nan")
        nan = llm.generate([prompt()], sp)[0].token_ids
    return {"zeros": zeros, "freed": freed, "junk_same": junk == clean,
            "nan_same": nan == clean}


def null_block_after() -> str:
    p = poisoned()
    return ("all zeros" if p["zeros"] else "written") + f" ({p['freed']} blocks given back)"


def poison() -> str:
    p = poisoned()
    return (f"finite junk: {'same text' if p['junk_same'] else 'other text'}; "
            f"NaN: {'same text' if p['nan_same'] else 'other text'}")


# ---------------------------------------------------------------------------- configurations

def family_windows(config: dict, max_model_len: int) -> tuple[int | None, ...]:
    """A config dict's windows as the engine serves them (the family's ``served_windows``)."""
    from nanoserve.config import ModelConfig
    from nanoserve.model.registry import model_class

    cfg = ModelConfig.from_dict(config)
    return model_class(cfg).served_windows(cfg, max_model_len)


def small(arch: str, model_type: str, layers: int, **extra) -> dict:
    return {"architectures": [arch], "model_type": model_type, "vocab_size": 64,
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, **extra}


def describe(windows: tuple[int | None, ...]) -> str:
    """Which layers are windowed, at what width, and whether the pool can give blocks back."""
    from nanoserve.engine.kv_manager import freeing_window

    on = [i for i, w in enumerate(windows) if w is not None]
    if not on:
        return f"full attention on all {len(windows)} layers"
    widths = ", ".join(f"{w:,}" for w in sorted({windows[i] for i in on}))
    which = (f"all {len(windows)} layers" if len(on) == len(windows) else
             f"layers {on[0]}-{on[-1]}" if on == list(range(on[0], on[-1] + 1)) else
             f"{len(on)} of {len(windows)} layers")
    kept = "blocks given back" if freeing_window(windows) else "every block kept"
    return f"{which} windowed at {widths}; {kept}"


def phi3_windows() -> str:
    mini = family_windows(small("Phi3ForCausalLM", "phi3", 32, sliding_window=2047,
                                max_position_embeddings=4096), 4096)
    long = family_windows(small("Phi3ForCausalLM", "phi3", 32, sliding_window=262144,
                                max_position_embeddings=131072), 131072)
    return f"{describe(mini)} / {describe(long)}"


def qwen2_windows() -> str:
    return describe(family_windows(small("Qwen2ForCausalLM", "qwen2", 28,
                                         use_sliding_window=True, max_window_layers=21,
                                         sliding_window=4096, max_position_embeddings=32768),
                                   32768))


def gemma_windows() -> tuple[int | None, ...]:
    from nanoserve.bench.shapes import shape_config

    return family_windows(shape_config("gemma-3-270m"), CONTEXT)


def gemma_served() -> str:
    return describe(gemma_windows())


def per_group_blocks(windows, context: int, block_size: int) -> tuple[int, int]:
    """Blocks one ``context``-token sequence holds, summed over layers: one pool for all layers
    (every layer keeps every block) and blocks per layer group (a windowed layer keeps at most
    the blocks one query sees)."""
    full = -(-context // block_size)
    one_pool = full * len(windows)
    grouped = sum(full if w is None else min(full, frozen.most_visible(w, block_size))
                  for w in windows)
    return one_pool, grouped


def gemma_share() -> str:
    one, grouped = per_group_blocks(gemma_windows(), CONTEXT, BLOCK)
    return f"{grouped / one:.1%}"


def gemma_bytes() -> str:
    """bfloat16 K and V of one KV head of 256 per layer: 1,024 bytes a layer a token."""
    from nanoserve.bench.shapes import shape_config

    c = shape_config("gemma-3-270m")
    per_cell = 2 * c["num_key_value_heads"] * c["head_dim"] * 2  # K and V, 2 bytes each
    one, grouped = per_group_blocks(gemma_windows(), CONTEXT, BLOCK)
    mib = [n * BLOCK * per_cell / 2**20 for n in (one, grouped)]
    return f"{mib[0]:.0f} MiB against {mib[1]:.0f} MiB"


def five_to_one_share() -> str:
    """Five local layers (window 1,024) to one global, 32,768 tokens, by positions."""
    share = (1 + 5 * 1024 / CONTEXT) / 6
    return f"{share:.1%}"


# ---------------------------------------------------------------------------- the rules alone

def frozen_agrees() -> str:
    """The snapshot's out_of_window against the KV manager's, on a grid."""
    from nanoserve.engine import kv_manager

    cases = list(itertools.product(range(300), range(1, 71), (1, 4, 16)))
    bad = sum(len(frozen.out_of_window(n, w, bs)) != kv_manager.out_of_window(n, w, bs)
              for n, w, bs in cases)
    return f"{len(cases) - bad:,} of {len(cases):,} cases agree"


def window_hit() -> str:
    """A 7-block cached prefix in blocks of 4 whose first two blocks were evicted, looked up
    with the plain rule and with the window's (12 tokens)."""
    from nanoserve.engine.prefix_cache import CachingBlockAllocator, block_hashes

    pool = CachingBlockAllocator(num_blocks=12, block_size=4)
    ids = list(range(100, 129))  # 29 tokens: 7 full blocks before the last token
    hashes = block_hashes(ids, 4)[:7]
    blocks = pool.allocate(7)
    pool.register(blocks, hashes, ids)
    pool.free(blocks)
    pool.forget(blocks[:2])
    plain = pool.match(hashes, ids)
    window = pool.match_window(hashes, ids, 12, -1)
    taken = sum(b != -1 for b in window)
    return (f"plain: {len(plain)} blocks; window: {len(window)} blocks, "
            f"{taken} taken and {len(window) - taken} placeholders")


CLAIMS = [
    exact("peak blocks held, window 64, blocks of 16, 32 + 480 tokens: freeing against keeping "
          "(reference backend)", lambda: peaks("reference")),
    exact("the same on the gathered backend", lambda: peaks("gathered")),
    exact("blocks the window gave back while the request ran", given_back),
    exact("text with blocks given back identical to text with every block kept", identical),
    exact("the most blocks any query of the run reads", most_blocks_seen),
    exact("the default pool for 2 sequences of 512 tokens in blocks of 16, with a null block",
          pool_sizes),
    exact("block 0 after a clean run of 32 + 160 tokens (reference)", null_block_after),
    exact("the same run again with the null block filled with ±10⁴, then with NaN", poison),
    exact("served windows: window 2,047 at max_model_len 4,096 (Phi-3-mini-4k); window "
          "262,144 at 131,072 (Phi-3.5-mini)", phi3_windows),
    exact("served windows: Qwen2, 28 layers, max_window_layers 21, window 4,096",
          qwen2_windows),
    exact("served windows: the Gemma-3-270M shape at 32,768 tokens", gemma_served),
    exact("Gemma-3-270M shape, one 32,768-token sequence, blocks of 16: KV kept with blocks per "
          "layer group, share of one pool's", gemma_share),
    exact("the same in bfloat16: one pool, blocks per group", gemma_bytes),
    exact("five local layers (window 1,024) to one global, 32,768 tokens: share kept with "
          "blocks per group", five_to_one_share),
    exact("the frozen out-of-window rule against kv_manager.out_of_window, next positions "
          "0-299, windows 1-70, blocks of 1, 4 and 16", frozen_agrees),
    exact("7 cached blocks of 4, the first two evicted, window 12: a prompt's hit", window_hit),
]
