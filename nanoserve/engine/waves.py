"""Static batching (Day 29) as a scheduling policy: waves that run until their last member ends.

Why this module exists: before continuous batching a batch was a wave. Up to ``max_num_seqs``
requests are admitted together, in arrival order, while each one's worst case fits the free pool
(blocks booked up front, ``allocation="reserve"``, so a wave is never preempted); the wave's
prompts are prefilled in one forward, and then every member decodes, step after step, until the
last one is done. A member that finishes early is *held*: its row is still computed, in place,
writing its last token's cell again, and keeps its blocks and its slot until the wave ends; the
next wave is admitted only then. That is the cost Day 29 measured (rows issued against tokens
kept), and ``batching="static"`` keeps it available to ``LLM``, ``AsyncLLM`` and the server
alike: it is the same scheduler with another ``schedule()``.

    out = waves.schedule()    # a wave in progress: out.decode computes, out.held sits in place
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanoserve.engine.request import Request
from nanoserve.engine.scheduler import Scheduler
from nanoserve.engine.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from nanoserve.config import EngineConfig
    from nanoserve.engine.kv_manager import KVCacheManager


class WaveScheduler(Scheduler):
    """The scheduler under Day 29's policy: whole prompts, worst cases booked, no step budget
    (a wave's prompts are one prefill), nothing released before the wave is over."""

    def __init__(self, kv_cache_manager: KVCacheManager, max_num_seqs: int, on_release=None,
                 compact_rows: bool = False, on_move=None):
        super().__init__(kv_cache_manager, max_num_seqs, allocation="reserve",
                         on_release=on_release, compact_rows=compact_rows, on_move=on_move,
                         chunked_prefill=False)

    @classmethod
    def from_config(cls, config: EngineConfig, kv_cache_manager: KVCacheManager,
                    max_model_len: int, **hooks) -> WaveScheduler:
        return cls(kv_cache_manager, config.max_num_seqs, compact_rows=config.persistent_batch,
                   **hooks)

    def schedule(self) -> SchedulerOutput:
        """A wave in progress: its unfinished members decode and its finished ones are held.
        No wave: release the last one, then admit the next (its prompts are this step's)."""
        self.schedule_calls += 1
        out = SchedulerOutput(finished=self._release_finished())
        self._free_out_of_window()
        if self.running:
            out.moves = self._compact()  # only an abort opens a hole in a wave
            for r in self.running:
                (out.held if r.is_finished else out.decode).append(r)
        else:
            out.chunks = self._admit(self.max_num_batched_tokens)
            out.admitted = [c.request for c in out.chunks]
        self._commit(out)
        return self._commit_decodes(out)

    def _release_finished(self) -> list[Request]:
        """Aborted members left at once (``abort``); the rest leave together, when the last
        of them is done."""
        if any(not r.is_finished for r in self.running):
            done, self._aborted = self._aborted, []
            return done
        return super()._release_finished()
