"""The docstring examples of metalearn.models.conv4 run and pass."""

from __future__ import annotations

import doctest

from metalearn.models import conv4


def test_docstring_examples():
    result = doctest.testmod(conv4, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
