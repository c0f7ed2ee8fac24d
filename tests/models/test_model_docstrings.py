"""The docstring examples of metalearn.models' modules run and pass."""

from __future__ import annotations

import doctest

import pytest

from metalearn.models import conv4, dropblock, patch_conv, resnet12


@pytest.mark.parametrize(
    "module", [conv4, dropblock, patch_conv, resnet12], ids=lambda m: m.__name__
)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
