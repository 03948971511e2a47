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

MODULES = [m.name for m in pkgutil.walk_packages(nanoserve.__path__, "nanoserve.")
           if not m.name.startswith(("nanoserve.kernels", "nanoserve.cli"))]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
