# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Day 65 notebook: one message per forward
#
# Rank 0 runs the whole engine; a worker runs only forwards, and before each one rank 0 tells it
# what to run in one int64 message that also carries the changes to the cache's addressing.
# In well under a minute on a CPU:
#
# 1. a message encoded by the frozen snapshot and by the package, and decoded back;
# 2. a `MirroredCache` journaling a few table operations, replayed on a plain cache;
# 3. the shipped model with `tensor_parallel_size=2`, with a spy on what rank 0 sends;
# 4. the worker killed before a step, and the `EngineBroken` that follows.
#
# Parts 3 and 4 spawn a worker process. A spawned process imports this file again (as
# `__mp_main__`) before it runs the worker, so everything at the top level runs twice: the
# engines live in `main()`, and every cell that prints sits under `if __name__ == "__main__":`
# so that the worker's copy stays quiet.

# %%
import pathlib
import sys

# The repository root, from the working directory (a Jupyter kernel has no __file__).
ROOT = next(p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]
            if (p / "nanoserve").is_dir())
sys.path.insert(0, str(ROOT))

import multiprocessing

import torch

from chapters.common import SHIPPED
from chapters.day65_tp_step.claims import PROMPTS, killed, killed_says, records
from chapters.day65_tp_step.snapshot import step as frozen
from nanoserve import LLM, SamplingParams
from nanoserve.attention.paged import BatchedPagedKVCache
from nanoserve.tp import mirror, protocol

KINDS = {frozen.PREFILL: "PREFILL", frozen.DECODE: "DECODE", frozen.STOP: "STOP"}
RECORDS = {frozen.EXTEND: "EXTEND", frozen.RESET: "RESET", frozen.ADOPT: "ADOPT",
           frozen.MOVE: "MOVE"}


def show_journal(journal: list[int]) -> str:
    """The records of a journal, one per line: ``EXTEND row 2 +[8, 9]``."""
    out, i = [], 0
    for op in records(journal):
        if op == frozen.EXTEND:
            n = journal[i + 2]
            out.append(f"EXTEND row {journal[i + 1]} +{journal[i + 3:i + 3 + n]}")
            i += 3 + n
        elif op == frozen.RESET:
            out.append(f"RESET  row {journal[i + 1]}")
            i += 2
        elif op == frozen.ADOPT:
            out.append(f"ADOPT  row {journal[i + 1]} takes {journal[i + 2]} cached tokens")
            i += 3
        else:
            out.append(f"MOVE   row {journal[i + 1]} -> row {journal[i + 2]}")
            i += 3
    return "\n".join(out) or "(empty)"


def show_message(ints: list[int]) -> str:
    kind, rows, tokens, hold, journal = frozen.decode(ints)
    lens = [len(t) for t in tokens]
    journal_text = show_journal(journal).replace("\n", "\n      ")
    return (f"{KINDS[kind]}: {len(ints)} ints, {frozen.broadcasts(ints)} broadcast(s); rows "
            f"{rows}, lens {lens}, hold {hold}\n  journal:\n      {journal_text}")


# %% [markdown]
# ## 1. One message, two encoders
#
# A decode step of four rows in which row 2 has just been given block 9. The message is the
# kind, three lengths, the rows, one token count per row, the held rows (none), the journal,
# and the tokens. The package's `protocol.encode` and the frozen `encode` must write the same
# integers, and both must decode back to the same fields.

# %%
if __name__ == "__main__":
    m = protocol.Message(protocol.DECODE, [0, 1, 2, 3], [[17], [42], [5], [99]], frozenset(),
                         [mirror.EXTEND, 2, 1, 9])
    ints = protocol.encode(m)
    print(ints)
    print("frozen encoder agrees:",
          ints == frozen.encode(m.kind, m.rows, m.token_lists, sorted(m.hold), m.journal))
    print("package decodes it back:", protocol.decode(ints) == m)
    print(show_message(ints))

# %% [markdown]
# The header is 1024 int64 and its first cell holds the length, so this message, and every
# decode step of up to a few hundred rows, is a single broadcast of the header. A prefill of a
# long prompt does not fit and sends the rest in a second broadcast of exactly the tail (the
# header's size in bytes is printed beside it):

# %%
if __name__ == "__main__":
    long = protocol.Message(protocol.PREFILL, [0], [list(range(3000))], frozenset(),
                            [mirror.EXTEND, 0, 3, 1, 2, 3])
    ints = protocol.encode(long)
    tail = len(ints) - (protocol.HEADER - 1)
    print(f"{len(ints)} ints: {frozen.broadcasts(ints)} broadcasts, the header "
          f"({protocol.HEADER * 8:,} B) and a tail of {tail} int64 ({tail * 8:,} B)")
    print("round trip:", protocol.decode(ints) == long)

# %% [markdown]
# ## 2. The journal, and its replay
#
# A `MirroredCache` is a `BatchedPagedKVCache` that writes every change to its addressing into
# a journal. Seven operations on a tiny cache (one layer, one KV head, 32 blocks of 4 cells,
# 4 rows): grants to rows 1 and 3, a prefix hit on row 1, row 3 growing, row 1 finishing,
# row 3 compacted down into row 1, and a newcomer in row 0.

# %%
if __name__ == "__main__":
    shape = (1, 1, 4, 32, 4, 4, 64)  # layers, KV heads, head dim, blocks, block size, rows, len
    ours, theirs = mirror.MirroredCache(*shape), BatchedPagedKVCache(*shape)
    ours.tables[1].extend([5, 6])      # a grant to row 1
    ours.tables[3].extend([2])         # a grant to row 3
    ours.adopt_prefix(1, 8)            # row 1 starts with 8 cached tokens (a prefix hit)
    ours.tables[3].extend([10, 11])    # row 3 grows
    ours.reset_row(1)                  # row 1 finishes
    ours.move_row(3, 1)                # compaction: row 3's tenant moves down to row 1
    ours.tables[0].extend([12])        # a newcomer in row 0
    journal = ours.take_journal()
    print(f"{len(journal)} ints:", journal)
    print(show_journal(journal))

# %% [markdown]
# The worker's cache is a plain `BatchedPagedKVCache`. `replay` calls the same methods rank 0
# called, so the tables, the lengths and the slot table's cells all come out equal. The frozen
# `apply` does the same over plain dicts and must reach the same tables.

# %%
if __name__ == "__main__":
    print("records replayed:", mirror.replay(theirs, journal))
    print("tables  rank 0:", [t.blocks for t in ours.tables])
    print("        worker:", [t.blocks for t in theirs.tables])
    print("lengths rank 0:", ours.lengths, " worker:", theirs.lengths)
    print("slot tables equal:", torch.equal(ours.slots.cells, theirs.slots.cells))
    tables, lengths = {r: [] for r in range(4)}, {}
    frozen.apply(tables, lengths, journal)
    print("frozen apply:  ", [tables[r] for r in range(4)])
    ours.tables[1].extend([13])  # the table that moved into row 1 journals as row 1 now
    print("after a grant to the moved row:", show_journal(ours.journal))
    mirror.replay(theirs, ours.take_journal())
    print("worker's row 1:", theirs.tables[1].blocks)

# %% [markdown]
# ## 3. Two ranks, and what rank 0 sends
#
# The shipped model in float32 with `tensor_parallel_size=2`: rank 0 here, one spawned worker
# process over gloo on 127.0.0.1. The spy wraps `llm.engine.executor.send` and keeps every
# message; the first few are printed as they go. Eight prompts of 32 greedy tokens over 4 rows
# make two waves of four.

# %%
def alive_workers() -> int:
    return sum(p.name.startswith("nanoserve-tp") and p.is_alive()
               for p in multiprocessing.active_children())


def traced_run() -> None:
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    with LLM(SHIPPED, dtype="float32", tensor_parallel_size=2, max_num_seqs=4) as llm:
        ex = llm.engine.executor
        print("worker processes:", alive_workers(), "-", ex.health())
        sent, send = [], ex.send

        def spy(m: protocol.Message) -> None:
            sent.append(protocol.encode(m))
            if len(sent) <= 4 or m.journal and len(sent) <= 40:
                print(f"[{len(sent)}] {show_message(sent[-1])}")
            send(m)

        ex.send = spy
        ex.comm.stats.reset()
        outs = llm.generate(PROMPTS, params)
        stats = ex.comm.stats
        print(f"\n{len(sent)} messages for {len(PROMPTS)} prompts x 32 tokens; kinds:",
              {name: sum(m[0] == k for m in sent) for k, name in KINDS.items()})
        for kind in sorted(stats.calls):
            print(f"  {kind:10s} {stats.calls[kind]:5d} calls {stats.nbytes[kind]:10,d} B")
        pending = show_journal(llm.engine.cache.journal).replace("\n", "\n    ")
        print(f"journal written after the last forward, for the next one:\n    {pending}")
        print("first completion:", repr(outs[0].text[:60]))
    print("worker processes after the with block:", alive_workers())


# %% [markdown]
# Only the messages with a non-empty journal are printed after the first four: most decode
# steps change no table. The broadcasts are the messages and nothing else; the all-reduces are
# the forward's (the embedding's and two per layer), and the gathers carry each rank's
# vocabulary shard of the logits to rank 0, never the other way.
#
# ## 4. A worker killed before a step
#
# `distributed_timeout_s` bounds how long rank 0 waits in one collective, but a dead worker
# does not make it wait: its connection is gone, the next broadcast fails at once, and the
# executor names what happened to the process.

# %%
def killed_worker() -> None:
    """The claims' own run: a worker killed, then a generate, then a shutdown."""
    got = killed()
    print(f"after {got['seconds']:.2f} s: {killed_says()}")
    print("worker processes after shutdown:", got["left"])


def main() -> None:
    traced_run()
    killed_worker()


# %%
if __name__ == "__main__":
    main()
