"""A saved run, read back for an evaluation: its config with ``key=value`` overrides applied,
and its runner with the parameters asked for. Every problem is an error of one line."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from metalearn.config import (
    Config,
    fill_added_keys,
    rename_old_keys,
    to_objects,
    training_only_reason,
)
from metalearn.config.compose import composition_error_message, name_key_group
from metalearn.errors import one_line
from metalearn.registry import GROUPS
from metalearn.runner.cpu_backend import prepare_machine
from metalearn.runner.experiment import build
from metalearn.runner.layout import enclosing_store
from metalearn.runner.plan import resolve
from metalearn.runner.run import Runner
from metalearn.runner.rundir import RunDirectory

# Keys every run's config.yaml holds; seed and name come last, so a file cut short misses them.
REQUIRED_KEYS = ("algorithm", "model", "data", "seed", "name")


def load_run_config(run_dir: str, overrides: list[str]) -> Config:
    """The validated config of a run directory with ``key=value`` overrides applied."""
    store = enclosing_store(run_dir)
    if store is not None:  # its .hydra/ holds a config.yaml: the evaluation wrote in there
        run = os.path.dirname(store)
        where = "is" if os.path.abspath(run_dir) == store else f"lies inside {store},"
        raise ValueError(
            f"{run_dir} {where} part of the run in {run}: evaluate that run, "
            f"python -m metalearn.evaluate {run}"
        )
    path = os.path.join(run_dir, "config.yaml")
    copy = os.path.join(run_dir, "checkpoints", "hydra", "config.yaml")
    if not os.path.exists(path) and os.path.exists(copy):  # Hydra's, kept with the checkpoints
        print(f"{path} not found: reading the run's Hydra config, {copy}", file=sys.stderr)
        path = copy
    elif not os.path.exists(path):
        jobs = sweep_jobs(run_dir)
        if jobs:  # a sweep's directory: its jobs are the runs
            raise FileNotFoundError(
                f"{run_dir} is a sweep's directory, not a run's: evaluate one of its "
                f"{len(jobs)} jobs, e.g. python -m metalearn.evaluate {jobs[0]}"
            )
        raise FileNotFoundError(f"{path} not found: is {run_dir!r} a metalearn run directory?")
    try:
        saved = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException, OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} cannot be read ({one_line(err)}); {_REWRITE}") from None
    if isinstance(saved, DictConfig) and OmegaConf.is_interpolation(saved, "run_name"):
        saved.run_name = saved.get("name")  # Hydra's copy leaves it to a resolver of the run
    missing = [k for k in REQUIRED_KEYS if not isinstance(saved, DictConfig) or k not in saved]
    if missing:
        raise ValueError(f"{path} is empty or half-written (no {', '.join(missing)}); {_REWRITE}")
    problem = _shape_problem(saved)
    if problem:
        raise ValueError(f"{path} is corrupt ({problem}); {_REWRITE}")
    moved = rename_old_keys(saved)
    if moved:
        print(f"{path} predates renamed keys: read {', '.join(moved)}", file=sys.stderr)
    filled = fill_added_keys(saved)
    if filled:
        print(f"{path} predates keys it ran without: read {', '.join(filled)}", file=sys.stderr)
    patch = _override_config(overrides, saved)
    try:  # unknown keys are refused by to_objects, naming the closest
        cfg = to_objects(OmegaConf.merge(saved, patch))
    except OmegaConfBaseException as err:  # a value of the wrong type, in a file or an override
        wrong = _wrong_value(err)
    else:
        for override in overrides:  # one an evaluation does not read would be recorded as used
            reason = training_only_reason(cfg, override.partition("=")[0])
            if reason:
                raise ValueError(
                    f"{override} cannot change an evaluation: {reason}; leave it out "
                    "(nothing was evaluated)"
                )
        return cfg
    try:
        to_objects(saved)
    except OmegaConfBaseException as err:  # in the file itself
        raise ValueError(f"{path} is corrupt ({_wrong_value(err)}); {_REWRITE}") from None
    except ValueError:  # the file's own problem is not the one the overrides ran into
        pass
    raise ValueError(
        f"{wrong}: check the overrides ({' '.join(overrides) or 'none'}) against the keys in {path}"
    )


def sweep_jobs(directory: str) -> list[str]:
    """The run directories directly under ``directory`` (a sweep's jobs), in numeric order.

    >>> sweep_jobs("/nonexistent")
    []
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    jobs = [n for n in names if os.path.isfile(os.path.join(directory, n, "config.yaml"))]
    jobs.sort(key=lambda n: (int(n.split("_")[0]) if n.split("_")[0].isdigit() else 1 << 62, n))
    return [os.path.join(directory, n) for n in jobs]


# The config's fixed sections (trainer, eval, ...) by their schema.
FIXED_SECTIONS = {
    f.default_factory: f.name
    for f in dataclasses.fields(Config)
    if dataclasses.is_dataclass(f.default_factory)
}


def _shape_problem(saved: DictConfig) -> str | None:
    """What makes a parsed config.yaml no run's config, in words; None if it has the right shape.

    >>> _shape_problem(OmegaConf.create({"trainer": 5, "seed": 0}))
    'trainer: 5 is not a section of settings'
    >>> _shape_problem(OmegaConf.create({"trainer": {}, "seed": "abc"}))
    "seed: 'abc' is not an integer"
    """
    raw = OmegaConf.to_container(saved)
    for key in (*GROUPS, *FIXED_SECTIONS.values()):
        if key in raw and not isinstance(raw[key], dict):
            return f"{key}: {raw[key]!r} is not a section of settings"
    if isinstance(raw["seed"], bool) or not isinstance(raw["seed"], int):
        return f"seed: {raw['seed']!r} is not an integer"
    return None


def _wrong_value(err: OmegaConfBaseException) -> str:
    """OmegaConf's complaint about a value, on one line, naming its setting (``section.key``)."""
    sections = dict(FIXED_SECTIONS)
    for group, registry in GROUPS.items():
        sections.update((registry.entry(n).config_cls, group) for n in registry.names())
    section = sections.get(getattr(err, "object_type", None))
    key = getattr(err, "full_key", None)
    setting = f"{section}.{key}" if section and key else key
    message = " ".join(str(err).split("\n")[0].split())
    return f"{setting}: {message}" if setting else message


def _override_config(overrides: Sequence[str], saved: DictConfig) -> DictConfig:
    """The ``key=value`` overrides, parsed as ``metalearn.train`` parses them, as a config to
    merge into ``saved``; a deletion, sweep, package or config group is refused."""
    for override in overrides:
        if "=" not in override or override.startswith("="):
            raise ValueError(f"override {override!r} is not key=value (e.g. eval.num_tasks=1000)")
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as err:
        raise ValueError(composition_error_message(err)) from None
    patch = OmegaConf.create()
    for override, item in zip(overrides, parsed, strict=True):
        key = item.key_or_group
        if item.type == OverrideType.DEL or item.is_sweep_override() or item.package:
            raise ValueError(
                f"override {override!r}: evaluate takes plain key=value overrides (no ~ "
                "deletion, a,b sweep or @package; a list is written [a,b])"
            )
        group = key if key in GROUPS else name_key_group(key)  # algorithm=X, algorithm.name=X
        if group:
            raise ValueError(
                f"{override}: a run is evaluated with the {group} it was trained with "
                f"({group}={saved[group].get('name')}); override its settings instead "
                f"({group}.KEY=VALUE)"
            )
        OmegaConf.update(patch, key, item.value(), merge=True, force_add=True)
    return patch


_REWRITE = (
    "restore it from a copy, or recreate it by composing the training command "
    "(python -m metalearn.train OVERRIDES --cfg job --resolve > config.yaml)"
)


def load_run(
    run_dir: str,
    which: str = "best",
    overrides: Sequence[str] = (),
    check: Callable[[str, Config], None] | None = None,
) -> tuple[Runner, object]:
    """A run directory's runner and saved parameters (``best``, ``latest`` or ``init``), with
    ``overrides`` applied and then ``check(run_dir, cfg)``, which may raise."""
    cfg = load_run_config(run_dir, list(overrides))
    if check is not None:
        check(run_dir, cfg)
    prepare_machine(cfg, training=False)
    print(f"loading {run_dir} ({which} parameters)", file=sys.stderr)
    runner = Runner(build(resolve(cfg)), RunDirectory(run_dir, cfg))
    return runner, runner.load(which)
