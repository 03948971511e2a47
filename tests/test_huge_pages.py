"""The small-M weights' mapping on 2 MiB pages (nanoserve/cpu/huge_pages.py).

The copies must be the tensors they replace, bit for bit, in one 2 MiB-aligned mapping; what the
kernel granted is read back, never assumed; where huge pages cannot be asked for, nothing moves
and the reason is said. Speed is a benchmark (``speedpaths pages``), not a test.
"""

from __future__ import annotations

import re

import pytest
import torch

from nanoserve.cpu import huge_pages
from nanoserve.cpu.huge_pages import HUGE_PAGE, huge_bytes, place

needs_thp = pytest.mark.skipif(huge_pages.unavailable() is not None,
                               reason=str(huge_pages.unavailable()))


@needs_thp
def test_the_copies_are_the_tensors_in_one_aligned_mapping():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(1000, 1000, generator=g).bfloat16(),
               torch.randn(3, 7, generator=g),  # odd sizes: each offset rounds to 64 bytes
               torch.randn(2500, 300, generator=g)]
    views, note = place(tensors)
    for t, v in zip(tensors, views, strict=True):
        assert v.dtype == t.dtype and v.shape == t.shape and v.is_contiguous()
        assert torch.equal(v, t) and v.data_ptr() != t.data_ptr()
        assert v.data_ptr() % 64 == 0
    assert views[0].data_ptr() % HUGE_PAGE == 0
    storages = {v.untyped_storage().data_ptr() for v in views}
    assert len(storages) == 1  # one mapping
    granted, asked = map(int, re.search(r"granted (\d+) of the (\d+)", note).groups())
    total = sum(t.numel() * t.element_size() for t in tensors)
    assert asked == -(-total // HUGE_PAGE) and 0 <= granted <= asked
    assert granted == huge_bytes(views[0].data_ptr()) // HUGE_PAGE


@needs_thp
def test_each_arena_counts_only_its_own_pages():
    # Arenas placed one after another may land side by side; were both advised to their edges,
    # smaps would show one merged mapping and each would report the other's huge pages as its own
    # (seen in CI: "granted 4 of the 3").
    arenas = [place([torch.zeros(3 * HUGE_PAGE // 2 + 1000 * i, dtype=torch.uint8)])
              for i in range(6)]
    for views, note in arenas:
        granted, asked = map(int, re.search(r"granted (\d+) of the (\d+)", note).groups())
        assert asked == 2 and granted <= asked
        assert huge_bytes(views[0].data_ptr()) <= asked * HUGE_PAGE


@needs_thp
def test_the_views_keep_the_mapping_alive():
    views, _ = place([torch.arange(1 << 20, dtype=torch.float32)])
    only = views[0]
    del views
    assert int(only[-1]) == (1 << 20) - 1 and float(only.sum()) == pytest.approx(
        (1 << 20) * ((1 << 20) - 1) / 2)


def test_where_huge_pages_are_off_nothing_moves(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "THP_SETTING", setting)
    tensors = [torch.ones(4, 4)]
    views, note = place(tensors)
    assert views is tensors and "off here" in note and "never" in note


def test_an_address_outside_every_mapping_has_no_huge_pages():
    assert huge_bytes(8) == 0


def test_the_engine_streams_its_small_m_copies_from_one_mapping():
    from nanoserve import LLM
    from nanoserve.config import DEFAULT_MODEL
    from nanoserve.layers.linear_methods import small_copies

    llm = LLM(DEFAULT_MODEL, dtype="bfloat16", max_num_seqs=2, max_model_len=64)
    smalls = [m.small for m in small_copies(llm.model)]
    if not smalls:
        assert llm.model.huge_pages in ("weights not packed", "no weights to place")
        pytest.skip(f"no small-M copies here: {llm.kernels_reason}; {llm.prepack_reason}")
    if huge_pages.unavailable():
        assert llm.model.huge_pages == huge_pages.unavailable()
        return
    assert len({s.untyped_storage().data_ptr() for s in smalls}) == 1
    assert llm.model.huge_pages.startswith(f"{len(smalls)} weights")
