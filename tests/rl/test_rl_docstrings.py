"""The docstring examples of metalearn.rl's modules run and pass."""

from __future__ import annotations

import doctest

import pytest

from metalearn.rl import baseline, estimators, inner, maml_rl, policy, ppo, rollout, trpo
from metalearn.rl.envs import nav2d

MODULES = [baseline, estimators, inner, maml_rl, nav2d, policy, ppo, rollout, trpo]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
