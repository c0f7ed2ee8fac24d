"""Each default has one home: the config dataclass an entry registers (or the top-level
dataclasses of metalearn/config/schema.py). Factories take that dataclass instead of repeating its
defaults as keywords, config YAMLs set only what differs from it, and a Flax module's
attribute defaults are read from it."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib

import pytest
import yaml

import metalearn.config as config
from metalearn.models.mlp import MLP, MLPConfig
from metalearn.models.resnet12 import ResNet12, ResNet12Config
from metalearn.models.rrnet import RRNet, RRNetConfig
from metalearn.registry import ALGORITHMS, MODELS, TASKS

CONF = pathlib.Path(config.__file__).parents[1] / "conf"
REGISTRIES = {"algorithm": ALGORITHMS, "model": MODELS, "data": TASKS}
FIXED = {"optimizer": config.OptimizerConfig, "trainer": config.TrainerConfig}


def defaults(cls) -> dict:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def same(value, default) -> bool:
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value) == default
    return value == default and type(value) is type(default)


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_registered_factories_repeat_no_config_default(kind):
    registry = REGISTRIES[kind]
    for name in registry.names():
        entry = registry.entry(name)
        fields = set(defaults(entry.config_cls))
        repeated = [
            p.name
            for p in inspect.signature(entry.factory).parameters.values()
            if p.name in fields and p.default is not inspect.Parameter.empty
        ]
        assert not repeated, f"{kind} {name}: factory keywords {repeated} repeat its config"


def group_yamls():
    for group in [*REGISTRIES, *FIXED]:
        for path in sorted((CONF / group).glob("*.yaml")):
            yield group, path


def schema_of(group: str, values: dict, parents: list[str]) -> type:
    """The dataclass that types a section of ``group`` (its name, else its parent YAML's)."""
    if group in FIXED:
        return FIXED[group]
    base = values.get("name") or (parents[0] if parents else "")
    while base not in REGISTRIES[group].names():  # a variant of another YAML: that one's base
        parent = yaml.safe_load((CONF / group / f"{base}.yaml").read_text()) or {}
        base = parent.get("name") or parent_names(parent)[0]
    return REGISTRIES[group].entry(base).config_cls


def parent_names(values: dict) -> list[str]:
    """``defaults`` entries as bare names: ``/algorithm/mamlpp_schema@algorithm`` -> mamlpp."""
    names = [d for d in values.get("defaults", []) if isinstance(d, str) and d != "_self_"]
    return [d.split("@")[0].rsplit("/", 1)[-1].removesuffix("_schema") for d in names]


@pytest.mark.parametrize("group, path", list(group_yamls()), ids=lambda x: getattr(x, "stem", x))
def test_group_yamls_set_only_what_differs_from_the_schema(group, path):
    text = path.read_text()
    values = yaml.safe_load(text) or {}
    parents = parent_names(values)
    if text.lstrip().startswith("# @package _global_"):  # sections of several groups
        sections = {g: v for g, v in values.items() if g in REGISTRIES or g in FIXED}
    else:
        sections = {group: values}
    for section, entries in sections.items():
        schema = schema_of(section, entries, parents if section == group else [])
        repeated = {
            k: v
            for k, v in entries.items()
            if k not in ("defaults", "name")
            and k in defaults(schema)
            and same(v, defaults(schema)[k])
        }
        assert not repeated, f"{path.name} repeats {schema.__name__} defaults: {repeated}"


def test_top_level_yaml_repeats_no_config_default():
    values = yaml.safe_load((CONF / "config.yaml").read_text())
    top = defaults(config.Config)
    repeated = {k: v for k, v in values.items() if k in top and same(v, top[k])}
    assert not repeated, repeated


@pytest.mark.parametrize(
    "module, config_cls",
    [(MLP, MLPConfig), (ResNet12, ResNet12Config), (RRNet, RRNetConfig)],
    ids=["mlp", "resnet12", "rrnet"],
)
def test_module_attribute_defaults_are_the_configs(module, config_cls):
    fields = defaults(config_cls)
    for f in dataclasses.fields(module):
        if f.name in fields and f.name != "name" and f.default is not dataclasses.MISSING:
            assert f.default == fields[f.name], f.name
