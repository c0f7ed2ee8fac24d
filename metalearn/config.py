"""Structured configs: the schema Hydra validates every composed config against.

The top level (:class:`Config`) is typed here; the ``algorithm``, ``model`` and ``data`` groups
are typed by the dataclasses their entries register in :mod:`metalearn.registry`, stored in
Hydra's ConfigStore as ``<group>/<name>_schema`` (internal: the YAMLs' defaults; refused on the
command line). An entry the package ships no ``conf/<group>/<name>.yaml`` for is also stored as
``<group>/<name>``, so ``algorithm=NAME`` selects it with its defaults. So a wrong type or an
unknown key fails at composition (``metalearn.train`` reports it in one line, see
:mod:`metalearn.config_errors`); a key appended with ``+`` is refused by :func:`to_objects`.
:func:`validate` then checks values (positive rates, sensible step counts, a writable output
directory) before anything compiles.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import os
import sys
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import MISSING, DictConfig, OmegaConf

import metalearn.algorithms  # noqa: F401  (registers algorithms)
import metalearn.data  # noqa: F401  (registers task distributions)
import metalearn.models  # noqa: F401  (registers models)
import metalearn.rl  # noqa: F401  (registers the RL task family, policy model and algorithm)
from metalearn.config_errors import SCHEMA_SUFFIX, unknown_key_message, unknown_keys
from metalearn.core.batching import TASK_BATCHING, is_task_batching
from metalearn.data.sources import file_in_the_way
from metalearn.registry import GROUPS, OTHER_PARTS


@dataclasses.dataclass
class OptimizerConfig:
    """The outer (meta) optimiser, built with optax."""

    name: str = "adam"  # adam | adamw | sgd
    lr: float = 1e-3
    schedule: str = "constant"  # constant | cosine (cosine decays to lr * final_lr_fraction)
    final_lr_fraction: float = 0.0
    warmup_steps: int = 0
    weight_decay: float = 0.0  # adamw only
    momentum: float = 0.0  # sgd only
    grad_clip_norm: float = 0.0  # 0 disables clipping


@dataclasses.dataclass
class TrainerConfig:
    """The training loop."""

    # Settings an evaluation of a saved run does not read (metalearn.evaluate refuses them as
    # overrides), each with what sets its part of an evaluation ("" when nothing does). Any
    # config class may declare its own: see :func:`training_only_reason`.
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "meta_steps": "",
        "meta_batch_size": "",
        "shots": "eval.shots are the evaluation's shots",
        "steps_per_call": "",
        "log_every": "",
        "eval_every": "",
        "checkpoint_every": "",
        "keep_checkpoints": "",
        "resume": "",
        "allow_changes": "",
        "progress_bar": "evaluate shows its progress on stderr by itself",
    }

    meta_steps: int = 70_000  # meta-updates in the whole run
    meta_batch_size: int = 25
    shots: int = 10  # support examples per class (per task for regression) during training
    # auto | vmap | unroll | map | map<k>: how tasks in a meta-batch run. auto on CPU: map for
    # RL task families, and for conv models with one XLA:CPU device per core each looping over
    # its share of the tasks; vmap otherwise.
    task_batching: str = "auto"
    steps_per_call: int = 0  # meta-steps fused into one jitted call (lax.scan); 0: auto
    log_every: int = 1000
    eval_every: int = 10_000  # 0: evaluate only at the end
    checkpoint_every: int = 10_000
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the latest checkpoint in the run directory
    # Keys (or sections) a resumed run may change from the stored config, e.g. [trainer.meta_steps]
    allow_changes: list[str] = dataclasses.field(default_factory=list)
    shard_tasks: bool = True  # with several devices, split each meta-batch's tasks across them
    progress_bar: str = "auto"  # auto (a TTY gets a bar) | bar | lines
    # JAX's persistent compilation cache, so reruns and sweep jobs reuse compiled meta-steps.
    # auto: $JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/metalearn/jax (~/.cache/...);
    # a path: that directory; off (or null): no cache. See metalearn/runner/compilation_cache.py.
    compilation_cache: str | None = "auto"


@dataclasses.dataclass
class EvalConfig:
    """Held-out evaluation: mean and 95% confidence interval over ``num_tasks`` tasks."""

    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "val_tasks": "eval.num_tasks is the number of test tasks",
        "select_best": "--which best|latest|init chooses the parameters evaluated",
    }

    shots: list[int] = dataclasses.field(default_factory=lambda: [5, 10, 20])
    steps: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 5, 10])
    num_tasks: int = 600
    val_tasks: int = 200  # tasks of the validation split in each periodic evaluation
    tasks_per_call: int = 100  # tasks evaluated per jitted call
    seed: int = 1_000_003  # evaluation tasks come from this seed, never the training seed
    select_best: bool = True  # test the parameters that did best on the validation split


@dataclasses.dataclass
class DistributedConfig:
    """Multi-host training through ``jax.distributed.initialize``."""

    enabled: bool = False
    coordinator_address: str | None = None  # host:port; unset: detected (e.g. from SLURM)
    num_processes: int | None = None
    process_id: int | None = None


@dataclasses.dataclass
class Config:
    # Top-level keys and whole sections an evaluation does not read.
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "seed": "the test tasks are drawn from eval.seed",
        "name": "",
        "run_name": "",
        "optimizer": "",
        "distributed": "evaluate runs in one process",
    }

    algorithm: Any = MISSING
    model: Any = MISSING
    data: Any = MISSING
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    seed: int = 0
    name: str = "run"
    run_name: str = ""  # name plus what the command line changed (conf/config.yaml); the run dir


def training_only_reason(cfg: Config, key: str) -> str | None:
    """Why an evaluation of a run with config ``cfg`` cannot depend on the setting ``key``
    (dotted, as on the command line): it is read in training only, as the ``TRAINING_ONLY``
    mapping of :class:`Config` or of the section's config class declares; None when an
    evaluation reads it. A researcher's own config class may declare such a mapping too.

    >>> training_only_reason(Config(), "seed")
    'seed is read in training only (the test tasks are drawn from eval.seed)'
    >>> training_only_reason(Config(), "trainer.meta_steps")
    'trainer.meta_steps is read in training only'
    >>> training_only_reason(Config(), "optimizer.lr")
    'optimizer.lr is read in training only'
    >>> training_only_reason(Config(), "eval.num_tasks") is None
    True
    """
    section, _, rest = key.lstrip("+").partition(".")
    if section in Config.TRAINING_ONLY:
        setting, hint = key.lstrip("+"), Config.TRAINING_ONLY[section]
    else:
        declared = getattr(type(getattr(cfg, section, None)), "TRAINING_ONLY", {})
        name = rest.partition(".")[0]
        if name not in declared:
            return None
        setting, hint = f"{section}.{name}", declared[name]
    return f"{setting} is read in training only" + (f" ({hint})" if hint else "")


# Config groups whose choice on the command line becomes part of the run name.
RUN_NAME_GROUPS = ("algorithm", "model", "data", "optimizer", "debug")


def register_configs() -> None:
    """Store the top-level schema and one schema per registered algorithm/model/data entry.

    An entry without a YAML in the package is stored under its plain name too (``group=NAME``).

    Also registers the ``metalearn_run_name`` resolver used by ``run_name`` in conf/config.yaml.
    """
    if not OmegaConf.has_resolver("metalearn_run_name"):
        OmegaConf.register_new_resolver("metalearn_run_name", _run_name_from_hydra)
    if not OmegaConf.has_resolver("metalearn_glob_free"):
        OmegaConf.register_new_resolver("metalearn_glob_free", glob_free)
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    for group, registry in GROUPS.items():
        for name in registry.names():
            schema = registry.entry(name).config_cls
            store.store(group=group, name=f"{name}{SCHEMA_SUFFIX}", node=schema)
            if not _has_yaml(group, name):  # selectable as group=NAME without a YAML
                node = OmegaConf.structured(schema)
                OmegaConf.set_readonly(node, False)  # a frozen dataclass's is read-only
                node.name = name
                store.store(group=group, name=name, node=node)


def _has_yaml(group: str, name: str) -> bool:
    """Whether the package ships ``metalearn/conf/<group>/<name>.yaml``.

    >>> _has_yaml("algorithm", "maml"), _has_yaml("algorithm", "no_such_algorithm")
    (True, False)
    """
    return importlib.resources.files("metalearn.conf").joinpath(group, f"{name}.yaml").is_file()


# What each of glob's special characters becomes in a sweep job's directory name.
GLOB_REPLACEMENTS = {"[": "(", "]": ")", "*": "_", "?": "_"}
GLOB_CHARACTERS = "".join(GLOB_REPLACEMENTS)


def glob_free(text: str) -> str:
    """``text`` with glob's special characters replaced, for a sweep job's directory name.

    Orbax finds the pieces of a checkpoint it saves with ``glob`` on the save path, so under a
    directory named e.g. ``eval.steps=[0,1]`` it skips merging them and the checkpoint cannot
    be restored. Used by ``hydra.sweep.subdir`` (conf/config.yaml).

    >>> glob_free("eval.steps=[0,1],seed=2")
    'eval.steps=(0,1),seed=2'
    """
    return text.translate(str.maketrans(GLOB_REPLACEMENTS))


def run_name(name: str, overrides: Sequence[str]) -> str:
    """``name`` followed by the config groups, and the other parts (``data.env``: an RL
    environment, :data:`metalearn.registry.OTHER_PARTS`), the command line chose (what actually
    runs), unless the name already says them.

    Groups come in the order of :data:`RUN_NAME_GROUPS`; an explicit ``name=...`` is kept as given.

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


def check_group_choices(choices: Mapping[str, Any], options: Mapping[str, Sequence[str]]) -> None:
    """Refuse a config group choice that is an internal schema entry (e.g. ``maml_schema``).

    ``choices`` maps groups to the chosen option (Hydra's ``runtime.choices``), ``options``
    maps groups to the options that exist.

    >>> check_group_choices({"algorithm": "maml_schema"}, {"algorithm": ["maml", "maml_schema"]})
    Traceback (most recent call last):
    ...
    ValueError: algorithm=maml_schema is an internal schema entry, not an option; use one of: maml
    """
    for group in GROUPS:
        choice = choices.get(group)
        if choice and str(choice).endswith(SCHEMA_SUFFIX):
            public = [o for o in options.get(group, []) if not o.endswith(SCHEMA_SUFFIX)]
            raise ValueError(
                f"{group}={choice} is an internal schema entry, not an option; "
                f"use one of: {', '.join(public)}"
            )


def to_objects(cfg: DictConfig) -> Config:
    """Turn a composed config into plain dataclasses: nothing from OmegaConf reaches jit.

    A key no schema has (appended with ``+``, which Hydra allows) is refused, not ignored.
    """
    _refuse_unknown_keys(cfg)

    def section(schema: type, key: str) -> Any:
        # A section missing from the config (e.g. a run saved by an older version) takes the
        # schema's defaults.
        return OmegaConf.to_object(OmegaConf.merge(schema, cfg.get(key) or {}))

    top = Config(
        algorithm=_group_object("algorithm", cfg.algorithm),
        model=_group_object("model", cfg.model),
        data=_group_object("data", cfg.data),
        optimizer=section(OptimizerConfig, "optimizer"),
        trainer=section(TrainerConfig, "trainer"),
        eval=section(EvalConfig, "eval"),
        distributed=section(DistributedConfig, "distributed"),
        seed=int(cfg.seed),
        name=str(cfg.name),
        run_name=str(cfg.get("run_name") or cfg.name),
    )
    validate(top)
    return top


def _refuse_unknown_keys(cfg: DictConfig) -> None:
    """Raise ValueError naming the first key of ``cfg`` that its schema does not have."""
    groups = {}
    for group, registry in GROUPS.items():
        node = cfg.get(group)
        if isinstance(node, DictConfig) and node.get("name") in registry.names():
            groups[group] = registry.entry(node.name).config_cls
    for full_key, schema in unknown_keys(cfg, Config, sections=groups):
        raise ValueError(unknown_key_message(full_key, schema))


def _group_object(group: str, node: DictConfig) -> Any:
    registry = GROUPS[group]
    if "name" not in node:
        raise ValueError(f"{group} config has no 'name'; pick one of {registry.names()}")
    schema = registry.entry(node.name).config_cls
    return with_tuples(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node)))


def with_tuples(config: Any) -> Any:
    """``config`` (a dataclass, changed in place) with the lists that OmegaConf made of its
    fields typed ``tuple`` turned back into tuples, in nested dataclasses too: a researcher's
    ``sizes: tuple[int, ...] = (40, 40)`` arrived as ``[40, 40]``, unequal to ``(40, 40)``
    and unhashable.

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
    if hint is tuple or typing.get_origin(hint) is tuple:
        return True
    return any(_is_tuple_type(arg) for arg in typing.get_args(hint)) if _is_union(hint) else False


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine")


MAX_SEED = 2**32 - 1  # JAX keys are built from 32 bits of the seed: larger seeds collide


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _settings(node: Any, kind: type, prefix: str = "") -> list[tuple[str, Any]]:
    """Every value of type ``kind`` in a config (in lists too, bools never), by dotted key.

    >>> _settings(OptimizerConfig(lr=float("inf")), float, "optimizer")[0]
    ('optimizer.lr', inf)
    """
    if dataclasses.is_dataclass(node):
        found = []
        for field in dataclasses.fields(node):
            key = f"{prefix}.{field.name}" if prefix else field.name
            found += _settings(getattr(node, field.name), kind, key)
        return found
    if isinstance(node, (list, tuple)):
        return [pair for item in node for pair in _settings(item, kind, prefix)]
    return [(prefix, node)] if isinstance(node, kind) and not isinstance(node, bool) else []


MAX_INT32 = 2**31 - 1  # JAX computes with 32-bit integers: step counts, sizes, shapes


def validate(cfg: Config) -> None:
    """Check values the types cannot express; raise ValueError naming the key."""
    for key, value in _settings(cfg, float):
        _require(math.isfinite(value), f"{key} must be a finite number, got {value}")
    for key, value in _settings(cfg, int):  # overflowed in JAX (a traceback) or aborted XLA
        _require(
            key in ("seed", "eval.seed") or abs(value) <= MAX_INT32,
            f"{key}={value} is beyond the 32-bit integers JAX computes with (at most "
            f"2**31 - 1 = {MAX_INT32}); give a smaller value",
        )
    t, o, e = cfg.trainer, cfg.optimizer, cfg.eval
    for key, seed in (("seed", cfg.seed), ("eval.seed", e.seed)):
        _require(
            0 <= seed <= MAX_SEED,
            f"{key} must be an integer in [0, 2**32 - 1] (JAX keys use 32 bits of it, so other "
            f"values collide with seeds in that range), got {seed}",
        )
    _require(
        t.meta_steps >= 0,
        f"trainer.meta_steps must be >= 0 (0: evaluate the initialisation), got {t.meta_steps}",
    )
    _require(
        t.meta_batch_size >= 1, f"trainer.meta_batch_size must be >= 1, got {t.meta_batch_size}"
    )
    _require(t.shots >= 1, f"trainer.shots must be >= 1, got {t.shots}")
    _require(
        t.steps_per_call >= 0,
        f"trainer.steps_per_call must be >= 0 (0: auto), got {t.steps_per_call}",
    )
    for key in ("log_every", "checkpoint_every"):
        value = getattr(t, key)
        _require(value >= 1, f"trainer.{key} must be >= 1, got {value}")
    _require(t.eval_every >= 0, f"trainer.eval_every must be >= 0, got {t.eval_every}")
    _require(
        t.keep_checkpoints >= 1, f"trainer.keep_checkpoints must be >= 1, got {t.keep_checkpoints}"
    )
    _require(
        is_task_batching(t.task_batching),
        f"trainer.task_batching must be one of {TASK_BATCHING} or map<k> (k loops side by "
        f"side, e.g. map2), got {t.task_batching!r}",
    )
    _require(
        t.progress_bar in ("auto", "bar", "lines"),
        f"trainer.progress_bar must be auto, bar or lines, got {t.progress_bar!r}",
    )
    _require(o.name in OPTIMIZERS, f"optimizer.name must be one of {OPTIMIZERS}, got {o.name!r}")
    _require(o.lr > 0, f"optimizer.lr must be > 0, got {o.lr}")
    _require(
        o.schedule in SCHEDULES,
        f"optimizer.schedule must be one of {SCHEDULES}, got {o.schedule!r}",
    )
    _require(o.warmup_steps >= 0, f"optimizer.warmup_steps must be >= 0, got {o.warmup_steps}")
    _require(
        o.grad_clip_norm >= 0, f"optimizer.grad_clip_norm must be >= 0, got {o.grad_clip_norm}"
    )
    _require(o.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, got {o.weight_decay}")
    _require(
        o.weight_decay == 0 or o.name == "adamw",
        f"optimizer.weight_decay={o.weight_decay} is used by optimizer.name=adamw only, and "
        f"optimizer.name={o.name}: set optimizer.name=adamw, or leave weight_decay at 0",
    )
    _require(0 <= o.momentum < 1, f"optimizer.momentum must be in [0, 1), got {o.momentum}")
    _require(
        o.momentum == 0 or o.name == "sgd",
        f"optimizer.momentum={o.momentum} is used by optimizer.name=sgd only, and "
        f"optimizer.name={o.name}: set optimizer.name=sgd, or leave momentum at 0",
    )
    _require(
        0 <= o.final_lr_fraction <= 1,
        f"optimizer.final_lr_fraction must be in [0, 1], got {o.final_lr_fraction}",
    )
    d = cfg.distributed
    if d.coordinator_address is not None:  # "notaport" was an IndexError traceback in JAX
        host, _, port = str(d.coordinator_address).rpartition(":")
        _require(
            bool(host) and port.isdigit() and 0 < int(port) < 65536,
            f"distributed.coordinator_address={d.coordinator_address} is not HOST:PORT (the "
            "first process's host name or address and a free port, e.g. node01:12345)",
        )
    unused = [
        f"distributed.{k}={getattr(d, k)}"
        for k in ("coordinator_address", "num_processes", "process_id")
        if getattr(d, k) is not None
    ]
    _require(
        d.enabled or not unused,
        f"{', '.join(unused)} {'are' if len(unused) > 1 else 'is'} used with "
        "distributed.enabled=true only: set it, or leave "
        "the distributed settings out (this process would have run alone, as process 0 of 1)",
    )
    _require(len(e.shots) >= 1, "eval.shots must be a non-empty list, got []")
    _require(len(e.steps) >= 1, "eval.steps must be a non-empty list, got []")
    _require(min(e.shots) >= 1, f"eval.shots must be >= 1, got {e.shots}")
    _require(min(e.steps) >= 0, f"eval.steps must be >= 0, got {e.steps}")
    for key in ("shots", "steps"):  # a repeated value wrote the same records twice
        values = list(getattr(e, key))
        _require(
            len(set(values)) == len(values),
            f"eval.{key} lists a value twice ({values}): give each once",
        )
    for key in ("num_tasks", "val_tasks", "tasks_per_call"):
        value = getattr(e, key)
        _require(value >= 1, f"eval.{key} must be >= 1, got {value}")


# Keys that were renamed: the old spelling fails with a message naming the new one.
RENAMED = {
    "algorithm.num_steps": "algorithm.inner_steps",
    "trainer.num_steps": "trainer.meta_steps",
    "algorithm.meta_lr_schedule": "optimizer.schedule",
    "algorithm.meta_lr_final_fraction": "optimizer.final_lr_fraction",
}


def renamed_key_errors(overrides: list[str]) -> list[str]:
    """One message per command-line override that uses a renamed key.

    >>> renamed_key_errors(["seed=1", "algorithm.num_steps=5"])
    ['algorithm.num_steps was renamed algorithm.inner_steps']
    """
    errors = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if "=" in override and key in RENAMED:
            errors.append(f"{key} was renamed {RENAMED[key]}")
    return errors


def rename_old_keys(saved: DictConfig) -> list[str]:
    """Move keys of a config saved before a rename to their new names, in place.

    Returns ``"old -> new"`` for each key moved; a config that holds both spellings is refused.

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


def unset_part_errors(overrides: list[str], groups: list[str]) -> list[str]:
    """One message per override that leaves the run without a part it needs: a config group
    set to ``null`` (``algorithm=null``) or a top-level entry deleted (``~algorithm``,
    ``~seed``); Hydra and OmegaConf failed on these with 40-70-line tracebacks.

    >>> for line in unset_part_errors(["model=null", "~seed", "~eval.shots"], ["model"]):
    ...     print(line)
    model=null: a run needs a model; choose one (model=NAME: --help lists them)
    ~seed: seed cannot be deleted, a run needs it; set it instead (seed=...)
    """
    errors = []
    for override in overrides:
        key, eq, value = override.partition("=")
        name = key.lstrip("+")
        if eq and name in groups and value.strip().lower() in ("null", "none", "~"):
            if name in OPTIONAL_GROUPS:
                errors.append(f"{name}=null: to run without {name}, leave the override out")
                continue
            errors.append(
                f"{name}=null: a run needs {'an' if name[0] in 'aeiou' else 'a'} {name}; "
                f"choose one ({name}=NAME: --help lists them)"
            )
        elif key.startswith("~") and "." not in key and key != "~":
            name = key[1:]
            errors.append(
                f"~{name}: {name} cannot be deleted, a run needs it; set it instead ({name}=...)"
            )
    return errors


OPTIONAL_GROUPS = ("experiment", "debug")  # appended with +NAME=..., absent by default


def exit_on_renamed_keys(argv: list[str], groups: list[str] = ()) -> None:
    """Print ``error: ...`` and exit 2 if an override in ``argv`` uses a renamed key, or
    leaves out a part a run needs (:func:`unset_part_errors`; ``groups``: the config groups)."""
    errors = renamed_key_errors(argv) + unset_part_errors(argv, list(groups))
    if errors:
        print(f"error: {'; '.join(errors)}", file=sys.stderr)
        sys.exit(2)


def check_writable(directory: str) -> None:
    """Fail early, with the path in the message, if outputs cannot be written there."""
    if any(c in directory for c in GLOB_CHARACTERS):
        raise ValueError(
            f"output directory {directory!r} contains one of {GLOB_CHARACTERS}: checkpoints "
            "saved under it cannot be restored (orbax finds their pieces with glob); choose "
            "another hydra.run.dir or hydra.sweep.dir"
        )
    try:
        os.makedirs(directory, exist_ok=True)
        # A name of its own: the processes of a distributed run check the same directory at
        # once, and one removed the probe another was about to remove ("cannot be written").
        descriptor, probe = tempfile.mkstemp(prefix=".write_test.", dir=directory)
        os.close(descriptor)
        os.remove(probe)
    except OSError as err:
        existing = file_in_the_way(directory)
        if existing is not None:  # "File exists" / "Not a directory" said less
            raise ValueError(
                f"output directory {directory!r}: {existing} is a file, not a directory; choose "
                "another hydra.run.dir or hydra.sweep.dir"
            ) from None
        raise ValueError(
            f"output directory {directory!r} cannot be written ({err.strerror}); choose another "
            "hydra.run.dir or hydra.sweep.dir, in a place you can write to"
        ) from None


def check_writable_file(path: str | os.PathLike, flag: str, example: str) -> None:
    """Raise ValueError (one line) unless ``path`` can be written as a file.

    Called before work whose result would be lost at the write; ``flag`` names the option
    (``--out``), ``example`` is a file name for the advice when ``path`` is a directory.

    >>> check_writable_file("/nonexistent/x.json", "--out", "eval.json")
    Traceback (most recent call last):
    ...
    ValueError: --out /nonexistent/x.json: /nonexistent does not exist; create it first
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        shown = os.path.join(path, example)
        raise ValueError(f"{flag} {path} is a directory: give a file name, e.g. {shown}")
    if not os.path.isdir(directory):
        raise ValueError(f"{flag} {path}: {directory} does not exist; create it first")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path}: permission denied; choose another {flag}")


class CheckOutputDirectory(Callback):
    """Hydra callback: fail in one line, before Hydra creates it, if the run dir is unwritable."""

    def _check(self, directory: str) -> None:
        try:
            check_writable(directory)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # as the job will: run_name needs it
        self._check(config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config.hydra.sweep.dir)
