"""Registering a part: a name twice in one module, a reload, a config class Hydra cannot hold, a
frozen config class, and config fields typed as tuples."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap

import pytest

from metalearn.config import register_configs, to_objects, with_tuples
from metalearn.registry import ALGORITHMS, PluginError, load_plugins
from tests.conftest import compose_config

ALGORITHM = textwrap.dedent(
    """
    import dataclasses

    from metalearn.algorithms.maml import maml
    from metalearn.registry import ALGORITHMS


    @dataclasses.dataclass{decorator_args}
    class {cls}:
        name: str = "{name}"
        inner_lr: float = 0.01
        sizes: tuple[int, ...] = (40, 40){extra_field}


    @ALGORITHMS.register("{name}", {cls})
    def {name}(objective, config=None):
        return maml(objective, inner_lr=config.inner_lr)
    """
)


def algorithm_module(name, cls="Config", decorator_args="", extra_field=""):
    return ALGORITHM.format(
        name=name, cls=cls, decorator_args=decorator_args, extra_field=extra_field
    )


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A directory on the import path for modules written by the test; the registry and
    sys.modules are put back afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ALGORITHMS, "_entries", dict(ALGORITHMS._entries))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def test_one_name_registered_twice_in_a_module_is_refused(modules):
    text = algorithm_module("reg_twice")
    second = text[text.index('@ALGORITHMS.register("reg_twice"') :]
    (modules / "reg_twice_algos.py").write_text(text + "\n\n" + second)
    with pytest.raises(ValueError, match="algorithm 'reg_twice' is registered twice by ") as err:
        importlib.import_module("reg_twice_algos")
    assert "reg_twice_algos.reg_twice (lines 15 and 20 of reg_twice_algos)" in str(err.value)
    assert "give one of them another name" in str(err.value)


def test_a_reloaded_module_registers_its_parts_again(modules):
    (modules / "reg_reloaded_algos.py").write_text(algorithm_module("reg_reloaded"))
    module = importlib.import_module("reg_reloaded_algos")
    first = ALGORITHMS.entry("reg_reloaded").factory
    importlib.reload(module)  # as a notebook's autoreload does after an edit
    assert ALGORITHMS.entry("reg_reloaded").factory is not first
    assert ALGORITHMS.entry("reg_reloaded").factory is module.reg_reloaded


def test_a_config_class_hydra_cannot_hold_is_one_line_naming_the_field(modules, monkeypatch):
    text = algorithm_module(
        "reg_callable", extra_field="\n    schedule: Callable | None = None"
    ).replace("import dataclasses\n", "import dataclasses\nfrom collections.abc import Callable\n")
    (modules / "reg_callable_algos.py").write_text(text)
    monkeypatch.setenv("METALEARN_PLUGINS", "reg_callable_algos")
    with pytest.raises(PluginError) as err:  # was a traceback ending every command
        load_plugins()
    message = str(err.value)
    assert "algorithm 'reg_callable': its config class Config cannot be a Hydra schema" in message
    assert "field 'schedule'" in message
    assert f"({modules / 'reg_callable_algos.py'}, line 17)" in message  # its line, not ours
    assert "\n" not in message


def test_a_frozen_config_class_is_selected_and_overridden(modules):
    (modules / "reg_frozen_algos.py").write_text(
        algorithm_module("reg_frozen", decorator_args="(frozen=True)")
    )
    importlib.import_module("reg_frozen_algos")
    register_configs()  # was a ReadonlyConfigError traceback
    cfg = to_objects(
        compose_config(
            ["+experiment=sinusoid_maml", "algorithm=reg_frozen", "algorithm.inner_lr=0.02"]
        )
    )
    assert cfg.algorithm.inner_lr == 0.02 and cfg.algorithm.sizes == (40, 40)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.algorithm.inner_lr = 0.5


def test_fields_typed_as_tuples_arrive_as_tuples(modules):
    (modules / "reg_tuple_algos.py").write_text(algorithm_module("reg_tuple"))
    importlib.import_module("reg_tuple_algos")
    register_configs()
    cfg = to_objects(
        compose_config(
            ["+experiment=sinusoid_maml", "algorithm=reg_tuple", "algorithm.sizes=[8,16]"]
        )
    )
    assert cfg.algorithm.sizes == (8, 16)  # was [8, 16]: unequal to (8, 16), unhashable


@dataclasses.dataclass
class Inner:
    widths: tuple[int, ...] | None = None
    names: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)
    pair: tuple[int, int] = (1, 2)


def test_with_tuples_reaches_nested_optional_and_frozen_fields():
    config = with_tuples(Outer(Inner([3, 4], ["a"]), [5, 6]))
    assert config.pair == (5, 6) and config.inner.widths == (3, 4)
    assert config.inner.names == ["a"]  # typed list: left a list
