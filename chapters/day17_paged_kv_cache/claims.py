"""Day 17's numbers: the paged cache gives the contiguous cache's logits; addressing is cheap."""

from __future__ import annotations

import torch

from chapters.common import LLAMA_3_2_1B, hf_checkpoint, meta_model, reference_prompts, tensor_bytes
from chapters.day01_llama_forward.snapshot.weights import load_model
from chapters.day07_kv_cache.snapshot.kv_cache import KVCache
from chapters.day14_block_allocator.snapshot.block_allocator import BlockAllocator
from chapters.runner import bound, exact

from .snapshot.paged import BatchedPagedKVCache, BlockTable, SlotTable

STEPS = 8


@torch.inference_mode()
def paged_vs_contiguous() -> float:
    """Worst relative logit difference, 5 configs x 4 prompts, prefill + 8 greedy decode steps."""
    from nanoserve.testing import CONFIGS, relative_logit_error

    worst = 0.0
    for name in CONFIGS:
        model = load_model(hf_checkpoint(name))
        for row, prompt in enumerate(reference_prompts()):
            n = len(prompt) + STEPS
            pool = BlockAllocator(64, 4)
            paged = BatchedPagedKVCache.for_model(model, 64, 4, 4, 128)
            paged.tables[row].extend(pool.allocate(pool.blocks_for_length(n)))
            contiguous = KVCache.for_model(model, 1, n)
            toks = list(prompt)
            for step in range(STEPS + 1):
                new = toks if step == 0 else toks[-1:]
                start = len(toks) - len(new)
                pos = torch.arange(start, len(toks))[None]
                paged.begin_step([row], [len(new)])
                a = model.compute_logits(model(torch.tensor([new]), pos, paged)[0, -1])
                paged.end_step()
                b = model.compute_logits(model(torch.tensor([new]), pos, contiguous)[0, -1])
                contiguous.advance(len(new))
                worst = max(worst, relative_logit_error(a, b))
                toks.append(int(b.argmax()))
    return worst


def cell_of_token_37() -> int:
    """Blocks [7, 2, 9], block_size 16: token 37 is block 37 // 16 = 2 (id 9), offset 5."""
    t = BlockTable(block_size=16, capacity=8)
    t.extend([7, 2, 9])
    return t.cells(37, 38)[0]


def cells_around_the_boundary() -> str:
    """The same table: tokens 30 and 31 end block 2, token 32 opens block 9."""
    t = BlockTable(block_size=16, capacity=8)
    t.extend([7, 2, 9])
    return ", ".join(map(str, t.cells(30, 33)))


def figure_tables() -> str:
    """The figure's case on an 8-block pool of 4-token blocks: an earlier request holds three
    blocks, A takes two and B one, the earlier request finishes, then A and B grow by one block
    each. Their tables, and the cell A's token 9 is written to."""
    pool = BlockAllocator(8, 4)
    earlier = pool.allocate(3)
    a, b = BlockTable(4, 8), BlockTable(4, 8)
    a.extend(pool.allocate(2))
    b.extend(pool.allocate(1))
    pool.free(earlier)
    a.extend(pool.allocate(1))
    b.extend(pool.allocate(1))
    return f"{a.blocks}, {b.blocks}; cell {a.cells(9, 10)[0]}"


def slot_bytes_per_token() -> int:
    return SlotTable(rows=1, max_model_len=1).cells.element_size()


def kv_bytes_per_token(cells_per_block: int = 16, blocks: int = 4) -> int:
    """Bytes of the K and V pools a paged cache allocates, per pool cell: built on the meta
    device for the Llama-3.2-1B shape in bf16, so the tensors have their size and no memory."""
    model = meta_model(LLAMA_3_2_1B, torch.bfloat16)
    cache = BatchedPagedKVCache.for_model(model, blocks, cells_per_block, 1, 16)
    return tensor_bytes(cache.k, cache.v) // (blocks * cells_per_block)


CLAIMS = [
    bound("paged vs contiguous cache, max relative logit difference (fp32)",
          paged_vs_contiguous, fmt="{:.2e}".format),
    exact("pool cell of token 37 in blocks [7, 2, 9], block_size 16", cell_of_token_37),
    exact("the same table: cells of tokens 30, 31 and 32", cells_around_the_boundary),
    exact("the figure's 8-block pool, block_size 4: A's table, B's table; A's token 9",
          figure_tables),
    exact("slot-table bytes per token (one int64 cell)", slot_bytes_per_token,
          fmt="{} bytes".format),
    exact("KV bytes per token it addresses (Llama-3.2-1B shape, bf16)", kv_bytes_per_token,
          fmt="{:,} bytes".format),
    exact("addressing overhead, slot table vs the KV it points at (ratio)",
          lambda: slot_bytes_per_token() / kv_bytes_per_token(), fmt="{:.3%}".format),
]
