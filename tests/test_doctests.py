"""The examples in the package's docstrings run, and say what the code does.

The book renders every module's docstring as its API page, so an example there is read as a
promise; doctest keeps it one.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import nanoserve


def _has_examples(name: str) -> bool:
    tests = doctest.DocTestFinder().find(importlib.import_module(name))
    return any(t.examples for t in tests)


# Only the modules that show examples: a module with none would be a test that cannot fail.
MODULES = [m.name for m in pkgutil.walk_packages(nanoserve.__path__, "nanoserve.")
           if _has_examples(m.name)]


def test_some_modules_show_examples():
    assert len(MODULES) >= 2, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, (
        f"{result.failed} of {result.attempted} examples failed in {name}")
