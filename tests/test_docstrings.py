"""Every public function carries a docstring with a runnable example, and the examples pass."""

import inspect

import pytest

import metalearn
from tests.conftest import run_docstring_examples

PUBLIC = [name for name in metalearn.__all__ if inspect.isfunction(getattr(metalearn, name))]


def test_public_api_names_of_the_design_contract_are_exported():
    for name in ["adapt", "maml_loss", "hvp", "hessian", "per_example_grads", "straight_through"]:
        assert name in metalearn.__all__


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_example_runs(name):
    fn = getattr(metalearn, name)
    assert fn.__doc__ and ">>>" in fn.__doc__, f"{name} has no runnable example"
    result = run_docstring_examples(fn, name, inspect.getmodule(fn))
    assert result.attempted > 0
    assert result.failed == 0, f"{name}: {result.failed} docstring example(s) failed"
