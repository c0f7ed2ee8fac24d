"""Composition: the configs Hydra composes from (each registered entry typed as
``<group>/<name>_schema``, so a wrong type or an unknown key fails at composition), and a composed
config turned into the schema's dataclasses (:func:`to_objects`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import re
import shlex
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

import metalearn.algorithms  # noqa: F401  (registers algorithms)
import metalearn.data  # noqa: F401  (registers task families)
import metalearn.models  # noqa: F401  (registers models)
import metalearn.rl  # noqa: F401  (registers the RL task family, policy model and algorithm)
from metalearn.config.schema import GLOB_CHARACTERS, Config
from metalearn.registry import GROUPS, OTHER_PARTS, PLUGINS_VARIABLE

SCHEMA_SUFFIX = "_schema"  # ConfigStore entries that hold a group's schema, not an option
# Config groups whose choice on the command line becomes part of the run name.
RUN_NAME_GROUPS = ("algorithm", "model", "data", "optimizer", "debug")


def register_configs() -> None:
    """Store the top-level schema and one per registered entry (under its plain name too when
    the package ships no YAML for it, so ``group=NAME`` selects it), and the resolvers."""
    OmegaConf.register_new_resolver("metalearn_run_name", _run_name_from_hydra, replace=True)
    OmegaConf.register_new_resolver("metalearn_glob_free", glob_free, replace=True)
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    conf = importlib.resources.files("metalearn.conf")
    for group, registry in GROUPS.items():
        for name in registry.names():
            schema = registry.entry(name).config_cls
            store.store(group=group, name=f"{name}{SCHEMA_SUFFIX}", node=schema)
            if not conf.joinpath(group, f"{name}.yaml").is_file():
                node = OmegaConf.structured(schema)
                OmegaConf.set_readonly(node, False)  # a frozen dataclass's is read-only
                node.name = name
                store.store(group=group, name=name, node=node)


def glob_free(text: str) -> str:
    """``text`` with glob's special characters replaced, for a sweep job's directory name: orbax
    globs a checkpoint's save path, so under ``eval.steps=[0,1]`` it could not be restored.

    >>> glob_free("eval.steps=[0,1],seed=2")
    'eval.steps=(0,1),seed=2'
    """
    return text.translate(str.maketrans(GLOB_CHARACTERS, "()__"))


def run_name(name: str, overrides: Sequence[str]) -> str:
    """``name`` followed by the config groups and parts the command line chose, unless it says them.

    >>> run_name("sinusoid_maml", ["+experiment=sinusoid_maml", "algorithm=reptile", "seed=3",
    ...                            "+debug=tiny"])
    'sinusoid_maml-algorithm=reptile-debug=tiny'
    >>> run_name("reptile_sinusoid", ["algorithm=reptile"])  # already in the name
    'reptile_sinusoid'
    >>> run_name("mine", ["name=mine", "algorithm=reptile"])
    'mine'
    >>> run_name("rl_nav2d_maml", ["+experiment=rl_nav2d_maml", "data.env=ant_dir"])
    'rl_nav2d_maml-data.env=ant_dir'
    >>> run_name("rl_cheetah_dir_maml", ["data.env=cheetah_dir"])
    'rl_cheetah_dir_maml'
    """
    parts = (*RUN_NAME_GROUPS, *OTHER_PARTS)
    chosen = {}
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if key == "name":
            return name
        if sep and value and key in parts and f"_{value}_" not in f"_{name}_":
            chosen[key] = value
    return "-".join([name] + [f"{k}={chosen[k]}" for k in parts if k in chosen])


def _run_name_from_hydra(name: str) -> str:
    if not HydraConfig.initialized():
        return name
    return run_name(name, list(HydraConfig.get().overrides.task))


def group_options() -> dict[str, list[str]]:
    """The options of each config group, as Hydra sees them (schema entries included)."""
    loader = GlobalHydra.instance().config_loader()
    return {g: loader.get_group_options(g) for g in GROUPS}


def check_group_choices(
    choices: Mapping[str, Any], options: Mapping[str, Sequence[str]] | None = None
) -> None:
    """Refuse a group choice (Hydra's ``runtime.choices``) that is an internal schema entry;
    ``options`` for the message, :func:`group_options` by default (read only to refuse).

    >>> check_group_choices({"algorithm": "maml_schema"}, {"algorithm": ["maml", "maml_schema"]})
    Traceback (most recent call last):
    ...
    ValueError: algorithm=maml_schema is an internal schema entry, not an option; use one of: maml
    """
    for group in GROUPS:
        choice = choices.get(group)
        if choice and str(choice).endswith(SCHEMA_SUFFIX):
            listed = (group_options() if options is None else options).get(group, [])
            public = [o for o in listed if not o.endswith(SCHEMA_SUFFIX)]
            raise ValueError(
                f"{group}={choice} is an internal schema entry, not an option; "
                f"use one of: {', '.join(public)}"
            )


def to_objects(cfg: DictConfig) -> Config:
    """A composed config as plain dataclasses (nothing from OmegaConf reaches jit); a key no
    schema has (appended with ``+``) is refused."""
    groups = {}
    for group, registry in GROUPS.items():
        node = cfg.get(group)
        if isinstance(node, DictConfig) and node.get("name") in registry.names():
            groups[group] = registry.entry(node.name).config_cls
    for full_key, schema in unknown_keys(cfg, Config, sections=groups):
        raise ValueError(unknown_key_message(full_key, schema))

    parts = {}
    for group, registry in GROUPS.items():
        node = getattr(cfg, group)
        if "name" not in node:
            raise ValueError(f"{group} config has no 'name'; pick one of {registry.names()}")
        schema = OmegaConf.structured(registry.entry(node.name).config_cls)
        parts[group] = with_tuples(OmegaConf.to_object(OmegaConf.merge(schema, node)))
    for field in dataclasses.fields(Config):  # the sections; a missing one takes the defaults
        if dataclasses.is_dataclass(field.default_factory):
            section = OmegaConf.merge(field.default_factory, cfg.get(field.name) or {})
            parts[field.name] = OmegaConf.to_object(section)
    return Config(
        **parts,
        seed=int(cfg.seed),
        name=str(cfg.name),
        run_name=str(cfg.get("run_name") or cfg.name),
    )


def with_tuples(config: Any) -> Any:
    """``config`` (changed in place) with the lists OmegaConf made of ``tuple`` fields tuples again.

    >>> @dataclasses.dataclass
    ... class Demo:
    ...     sizes: tuple[int, ...] = (40, 40)
    ...     names: list[str] = dataclasses.field(default_factory=list)
    >>> with_tuples(OmegaConf.to_object(OmegaConf.structured(Demo)))
    Demo(sizes=(40, 40), names=[])
    """
    try:
        hints = typing.get_type_hints(type(config))
    except Exception:  # an annotation that does not resolve: leave the fields as they are
        hints = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            with_tuples(value)
        elif isinstance(value, list) and _is_tuple_type(hints.get(field.name)):
            object.__setattr__(config, field.name, tuple(value))  # frozen dataclasses too
    return config


def _is_tuple_type(hint: Any) -> bool:
    """Whether ``hint`` is ``tuple``, ``tuple[...]`` or a union with one (``tuple | None``)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is_tuple_type(arg) for arg in typing.get_args(hint))
    return hint is tuple or origin is tuple


def unknown_key_message(full_key: str, schema: type) -> str:
    """Say that ``full_key`` is not a field of ``schema``, with the closest field and the list.

    >>> from metalearn.config import DistributedConfig
    >>> print(unknown_key_message("distributed.enable", DistributedConfig))  # doctest: +ELLIPSIS
    distributed.enable is not a setting of distributed (DistributedConfig: enabled, ...); did
    you mean distributed.enabled?
    """
    section, _, key = full_key.rpartition(".")
    names = [f.name for f in dataclasses.fields(schema)]
    close = difflib.get_close_matches(key, names, n=1)
    where = f"{section} ({schema.__name__}: " if section else "the config (top-level keys: "
    hint = f"; did you mean {section + '.' if section else ''}{close[0]}?" if close else ""
    return f"{full_key} is not a setting of {where}{', '.join(names)}){hint}"


def unknown_keys(
    node: DictConfig, schema: type, prefix: str = "", sections: Mapping[str, type] | None = None
) -> list[tuple[str, type]]:
    """Each dotted key of ``node`` that its schema has no field for, with that schema; a nested
    section is checked against its field's default dataclass, or ``sections[key]``.

    >>> from metalearn.config import EvalConfig
    >>> unknown_keys(OmegaConf.create({"seed": 0, "eval": {"num_task": 5}}), Config,
    ...              sections={"eval": EvalConfig})
    [('eval.num_task', <class 'metalearn.config.schema.EvalConfig'>)]
    """
    fields = {f.name: f for f in dataclasses.fields(schema)}
    sections = sections or {}
    found = []
    for key in node:
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            found.append((full, schema))
            continue
        factory = fields[key].default_factory
        nested = sections.get(key, factory if dataclasses.is_dataclass(factory) else None)
        child = node._get_node(key)
        if nested is not None and isinstance(child, DictConfig):
            found += unknown_keys(child, nested, full)
    return found


# Keys that were renamed: the old spelling fails with a message naming the new one.
RENAMED = {
    "algorithm.num_steps": "algorithm.inner_steps",
    "trainer.num_steps": "trainer.meta_steps",
    "algorithm.meta_lr_schedule": "optimizer.schedule",
    "algorithm.meta_lr_final_fraction": "optimizer.final_lr_fraction",
}


def rename_old_keys(saved: DictConfig) -> list[str]:
    """Move renamed keys of a saved config to their new names, in place; ``"old -> new"`` each.

    >>> saved = OmegaConf.create({"algorithm": {"num_steps": 5}, "trainer": {"num_steps": 3}})
    >>> rename_old_keys(saved), OmegaConf.to_container(saved)
    (['algorithm.num_steps -> algorithm.inner_steps', 'trainer.num_steps -> trainer.meta_steps'], \
{'algorithm': {'inner_steps': 5}, 'trainer': {'meta_steps': 3}})
    """
    moved = []
    for old, new in RENAMED.items():
        section, _, key = old.rpartition(".")
        node = saved.get(section)
        if not isinstance(node, DictConfig) or key not in node:
            continue
        if OmegaConf.select(saved, new) is not None:
            raise ValueError(f"the config holds both {old} and its new name {new}: delete {old}")
        OmegaConf.update(saved, new, node.pop(key), force_add=True)
        moved.append(f"{old} -> {new}")
    return moved


# Keys added with a default that behaves otherwise than before they existed: a saved config of
# one of the named options without the key ran with the value given here.
ADDED = {
    "algorithm.dampening": (("baseline", "baseline_pp"), 0.0),
    "algorithm.finetune_batch_size": (("baseline", "baseline_pp"), 0),
}


def fill_added_keys(saved: DictConfig) -> list[str]:
    """Give a saved config, in place, the value each key of :data:`ADDED` that it predates had
    before the key existed; ``"key=value"`` each.

    >>> saved = OmegaConf.create({"algorithm": {"name": "baseline", "finetune_lr": 0.1}})
    >>> fill_added_keys(saved), saved.algorithm.dampening
    (['algorithm.dampening=0.0', 'algorithm.finetune_batch_size=0'], 0.0)
    >>> fill_added_keys(OmegaConf.create({"algorithm": {"name": "maml"}}))
    []
    """
    filled = []
    for key, (options, value) in ADDED.items():
        section, _, name = key.rpartition(".")
        node = saved.get(section)
        if isinstance(node, DictConfig) and node.get("name") in options and name not in node:
            node[name] = value
            filled.append(f"{key}={value}")
    return filled


def selectable(group: str, option: str) -> bool:
    """Whether ``group=option`` is a choice: not a schema entry nor a ``base_*`` experiment.

    >>> [selectable("algorithm", "maml_schema"), selectable("experiment", "base_rl")]
    [False, False]
    """
    base = group == "experiment" and option.startswith("base_")
    return not (base or option.endswith(SCHEMA_SUFFIX))


def name_key_group(key: str) -> str | None:
    """The config group whose ``name`` key ``key`` is (``algorithm.name``: ``algorithm``), or None.

    >>> name_key_group("+algorithm.name"), name_key_group("algorithm.inner_lr")
    ('algorithm', None)
    """
    group, _, rest = key.lstrip("+~").partition(".")
    return group if group in GROUPS and rest == "name" else None


def composition_error_message(err: BaseException) -> str:
    """One line for an error Hydra or OmegaConf raised while composing the command line.

    >>> from hydra.errors import MissingConfigException
    >>> message = composition_error_message(MissingConfigException(
    ...     "Could not find 'algorithm/mamll'", "algorithm/mamll", ["maml", "maml_schema"]))
    >>> message.removesuffix(" (one of your own: name the module that registers it in "
    ...                      "METALEARN_PLUGINS)")
    'algorithm=mamll is not an option (did you mean maml?); use one of: maml'
    """
    cause = err.__cause__
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, name = err.missing_cfg_file.rpartition("/")
        options = [o for o in err.options if selectable(group, o)]
        close = difflib.get_close_matches(name, options, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        listed = ", ".join(options)
        message = f"{group or 'config'}={name} is not an option{hint}; use one of: {listed}"
        own = f" (one of your own: name the module that registers it in {PLUGINS_VARIABLE})"
        return message + (own if group in GROUPS else "")  # the groups plugins add to
    if isinstance(err, OverrideParseException):
        message = f"cannot parse the override {err.override!r}: {_lines(err.message)}"
        key, _, value = err.override.partition("=")
        if "mismatched input '='" in err.message and not value.startswith(("'", '"')):
            message += f"; a value holding '=' needs quotes: {quoted_override(key, value)}"
        return message
    key_errors = (ConfigKeyError, ConfigAttributeError)  # OmegaConf raises either
    key_error = err if isinstance(err, key_errors) else cause
    schema = key_error.object_type if isinstance(key_error, key_errors) else None
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        return unknown_key_message(str(key_error.full_key), schema)
    if isinstance(cause, ValidationError):  # "Error merging override optimizer.lr=fast"
        override = str(err).removeprefix("Error merging override ").strip()
        return f"{override}: {_lines(str(cause))}"
    return "; ".join(filter(None, [_lines(str(err)), _lines(str(cause)) if cause else ""]))


def _lines(text: str) -> str:
    """A multi-line message as one line, without OmegaConf's ``full_key:``/``object_type=``."""
    lines = (" ".join(line.split()) for line in text.splitlines())
    skip = ("full_key:", "object_type=", "reference_type=")
    return "; ".join(line for line in lines if line and not line.startswith(skip))


def quoted_override(key: str, value: str) -> str:
    """``key=value`` as one shell word that Hydra's override grammar parses back to ``value``:
    run directories are named after overrides, and Hydra reads an unquoted ``=``, ``,`` or space.

    >>> quoted_override("hydra.run.dir", "/runs/sinusoid_maml/2026-11-25_10-00-00")
    'hydra.run.dir=/runs/sinusoid_maml/2026-11-25_10-00-00'
    >>> print(quoted_override("hydra.run.dir", "/runs/sinusoid_maml-algorithm=fomaml/10-00-00"))
    'hydra.run.dir="/runs/sinusoid_maml-algorithm=fomaml/10-00-00"'
    """
    if re.fullmatch(r"[A-Za-z0-9_./:+@%-]+", value):
        return f"{key}={value}"
    quote = "'" if '"' in value else '"'
    return shlex.quote(f"{key}={quote}{value}{quote}")
