"""Every public function in metalearn/algorithms has a runnable example, and it passes.

The factories' examples build and compile a meta-learner (seconds each on a 2-core CPU), so they
carry the slow marker; the same code paths run in the default suite through the other tests.
"""

import importlib
import inspect

import pytest

from metalearn.registry import ALGORITHMS
from tests.conftest import run_docstring_examples

MODULES = ["base", "maml", "reptile", "anil", "meta_sgd", "mamlpp", "imaml", "protonet"]
FACTORIES = {ALGORITHMS.entry(name).factory for name in ALGORITHMS.names()}


def public_functions():
    for module_name in MODULES:
        module = importlib.import_module(f"metalearn.algorithms.{module_name}")
        for name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ and name[0] != "_":
                marks = [pytest.mark.slow] if fn in FACTORIES else []
                yield pytest.param(module, name, marks=marks, id=f"{module_name}.{name}")


PUBLIC = list(public_functions())
# Validation helpers and small internals documented by one line, without an example.
NO_EXAMPLE = {
    "check_positive",
    "check_nonnegative",
    "check_fraction",
    "check_count",
    "check_choice",
    "check_inner_loop_settings",
    "path_name",
    "named_leaves",
    "split_top_level",
    "evaluate_trajectory",
    "sgd_trajectory_fn",
    "query_metrics",
    "is_norm_parameter",
}


@pytest.mark.parametrize("module, name", PUBLIC)
def test_docstring_example_runs(module, name):
    fn = getattr(module, name)
    assert fn.__doc__, f"{name} has no docstring"
    if name in NO_EXAMPLE:
        return
    assert ">>>" in fn.__doc__, f"{name} has no runnable example"
    result = run_docstring_examples(fn, name, module)
    assert result.attempted > 0
    assert result.failed == 0, f"{name}: {result.failed} docstring example(s) failed"
