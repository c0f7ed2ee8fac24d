"""The docstring examples of metalearn.data's modules run and pass."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "metalearn.data.sources",
    "metalearn.data.fewshot_builder",
    "metalearn.data.class_split",
    "metalearn.data.episodes",
    "metalearn.data.omniglot",
    "metalearn.data.miniimagenet",
    "metalearn.data.cifar",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0
