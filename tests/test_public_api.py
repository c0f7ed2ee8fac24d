"""The public API of the design contract is exported, and every public function documents
itself with a runnable example (pytest --doctest-modules runs the examples)."""

import inspect

import pytest

import metalearn

PUBLIC = [name for name in metalearn.__all__ if inspect.isfunction(getattr(metalearn, name))]


def test_public_api_names_of_the_design_contract_are_exported():
    for name in ["adapt", "maml_loss", "hvp", "hessian", "per_example_grads", "straight_through"]:
        assert name in metalearn.__all__


@pytest.mark.parametrize("name", PUBLIC)
def test_public_function_has_a_runnable_example(name):
    doc = getattr(metalearn, name).__doc__
    assert doc and ">>>" in doc, f"{name} has no runnable example"
