"""The docstring examples of the config, runner and statistics modules run and pass."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "metalearn.config",
    "metalearn.runner.compilation_cache",
    "metalearn.runner.devices",
    "metalearn.runner.divergence",
    "metalearn.runner.evaluation",
    "metalearn.statistics",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted > 0 and result.failed == 0
