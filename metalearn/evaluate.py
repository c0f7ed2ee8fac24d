"""Evaluate a saved checkpoint on its own: ``python -m metalearn.evaluate RUN_DIR``.

Reads ``RUN_DIR/config.yaml``, restores the best-on-validation parameters (or the latest
checkpoint with ``--which latest``, or when the run has no ``best/``: a warning says so; or the
run's untrained initialisation with ``--which init``), evaluates on the test split and writes the
records, in the ``eval.json`` format plus ``checkpoint`` (best, latest or init) and
``checkpoint_step`` and ``overrides``, to ``RUN_DIR/eval_<best|latest|init>.json`` named after
the parameters actually evaluated (or ``--out``, checked before the evaluation starts; a file
there made with other overrides is replaced, and a line says so). Any setting of the saved config
can be overridden as ``key=value`` (e.g. ``eval.num_tasks=1000``), written as for
``metalearn.train``; an override that does not parse, an unknown key, a setting read in
training only (``seed``, ``optimizer.*``, ``trainer.meta_steps``, ``algorithm.inner_steps``:
the evaluation's are ``eval.seed`` and ``eval.steps``), an unreadable or corrupt config, a
missing checkpoint, an unwritable ``--out`` or a bad flag ends in one ``error:`` line and exit
status 2; Ctrl-C ends in one line, exit status 130.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from metalearn.config import (
    GROUPS,
    Config,
    check_writable_file,
    rename_old_keys,
    to_objects,
    training_only_reason,
)
from metalearn.config_errors import composition_error_message, name_key_group
from metalearn.data.sources import one_line
from metalearn.registry import load_plugins, selected_parts, user_code_error
from metalearn.runner.compilation_cache import enable_compilation_cache
from metalearn.runner.cpu_backend import schedule_lapack_calls_serially
from metalearn.runner.devices import out_of_memory_message
from metalearn.runner.evaluation import format_record
from metalearn.runner.experiment import needs_serial_lapack
from metalearn.runner.loop import Runner, load_for_evaluation
from metalearn.runner.rundir import enclosing_store
from metalearn.runner.signals import exit_at_once
from metalearn.tools import OneLineParser, check_output_file

# What this command writes in a run directory, and may replace (saying so): its own outputs.
# Any other record of a run (config.yaml, the training's eval.json, metrics.jsonl, ...) given
# as --out is refused; they were replaced silently.
OWN_OUTPUTS = ("eval_*.json",)

# Keys every config.yaml written by metalearn.train holds; seed and name come last in the file,
# so a file cut short misses them.
REQUIRED_KEYS = ("algorithm", "model", "data", "seed", "name")


def load_run_config(run_dir: str, overrides: list[str]) -> Config:
    """The validated config of a run directory with ``key=value`` overrides applied.

    Raises FileNotFoundError or ValueError with a one-line message: no config.yaml, an empty,
    half-written or corrupt one, an override that does not parse, is not ``key=value`` or names
    an unknown key.
    """
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
    patch = _override_config(overrides, saved)
    try:  # unknown keys are refused by to_objects, naming the closest
        cfg = to_objects(OmegaConf.merge(saved, patch))
    except OmegaConfBaseException as err:  # a value of the wrong type, in a file or an override
        wrong = _wrong_value(err)
    else:
        _refuse_training_settings(overrides, cfg)
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


def _refuse_training_settings(overrides: Sequence[str], cfg: Config) -> None:
    """ValueError for the first override of a setting an evaluation does not read
    (:func:`metalearn.config.training_only_reason`): it was recorded in the evaluation's
    ``overrides`` as if it had changed the numbers."""
    for override in overrides:
        reason = training_only_reason(cfg, override.partition("=")[0])
        if reason:
            raise ValueError(
                f"{override} cannot change an evaluation: {reason}; leave it out "
                "(nothing was evaluated)"
            )


def sweep_jobs(directory: str) -> list[str]:
    """The run directories directly under ``directory`` (a sweep's jobs: each has a
    ``config.yaml``), in their numeric order.

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


# The config's fixed sections (trainer, eval, ...) by their schema, and all its sections (those
# and the config groups): a mapping of settings each.
FIXED_SECTIONS = {
    f.default_factory: f.name
    for f in dataclasses.fields(Config)
    if dataclasses.is_dataclass(f.default_factory)
}
SECTIONS = (*GROUPS, *FIXED_SECTIONS.values())


def _shape_problem(saved: DictConfig) -> str | None:
    """What makes a parsed config.yaml no run's config, in words: a section that is not a
    mapping, a seed that is not an integer; None when it has the right shape. The values in
    the sections are checked against their schemas by :func:`to_objects`.

    >>> _shape_problem(OmegaConf.create({"trainer": 5, "seed": 0}))
    'trainer: 5 is not a section of settings'
    >>> _shape_problem(OmegaConf.create({"trainer": {}, "seed": "abc"}))
    "seed: 'abc' is not an integer"
    """
    raw = OmegaConf.to_container(saved)
    for key in SECTIONS:
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
    """The ``key=value`` overrides as a config to merge into ``saved``, parsed as
    ``metalearn.train`` parses them (Hydra's override grammar, its one-line messages).

    ``+key=value`` (or ``++``) sets the key as ``key=value`` does; a deletion (``~key``), a sweep
    (``a,b``) or a package (``key@pkg``) is refused, as is a config group (the run's own is kept).
    """
    for override in overrides:
        key, sep, _ = override.partition("=")
        if not sep or not key:
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


class EvaluationProgress:
    """A bar per shot count on a terminal, one line per shot count otherwise (on stderr)."""

    def __init__(self, num_tasks: int):
        self.num_tasks, self._bar, self._shots = num_tasks, None, None
        self._tty, self._start = sys.stderr.isatty(), time.perf_counter()

    def __call__(self, shots: int, done: int) -> None:
        if shots != self._shots:
            self.close()
            self._shots = shots
            if self._tty:
                self._bar = tqdm(total=self.num_tasks, desc=f"test {shots} shots", unit="task")
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif done == self.num_tasks:
            took = time.perf_counter() - self._start
            print(f"test {shots} shots: {done} tasks in {took:.1f} s", file=sys.stderr)
        if done == self.num_tasks:
            self._start = time.perf_counter()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def load_run(
    run_dir: str,
    which: str = "best",
    overrides: Sequence[str] = (),
    check: Callable[[str, Config], None] | None = None,
) -> tuple[Runner, Any]:
    """A run directory's runner and saved parameters (``best``, ``latest`` or ``init``), loaded
    as this module's command loads them: the validated config with ``overrides`` applied (then
    ``check(run_dir, cfg)``, which may raise), XLA:CPU's serial LAPACK scheduling where the run
    needs it (before any computation), the run's compilation cache. Says on stderr what it
    loads. Raises ValueError, FileNotFoundError or RuntimeError with a one-line message.
    """
    cfg = load_run_config(run_dir, list(overrides))
    if check is not None:
        check(run_dir, cfg)
    if needs_serial_lapack(cfg):  # before any computation
        schedule_lapack_calls_serially()
    enable_compilation_cache(cfg.trainer.compilation_cache)
    print(f"loading {run_dir} ({which} parameters)", file=sys.stderr)
    return load_for_evaluation(cfg, run_dir, which)


def replacement_note(out: str, overrides: Sequence[str]) -> str | None:
    """A line saying that the evaluation file ``out`` will be replaced by one made with
    ``overrides`` while it was made with others (or its records do not say with which); None
    when there is no ``out`` or it was made with the same overrides.
    """
    if not os.path.exists(out):
        return None
    try:
        with open(out) as f:
            made_with = {tuple(r["overrides"]) for r in json.load(f)}
    except (OSError, ValueError, TypeError, KeyError):  # no records, or older ones
        made_with = set()
    if made_with == {tuple(overrides)}:
        return None
    now = " ".join(overrides) or "none"
    if not made_with:
        return f"{out} will be replaced; its overrides are not recorded (this evaluation's: {now})"
    before = "; ".join(" ".join(o) or "none" for o in sorted(made_with))
    return f"{out} was made with other overrides ({before}): it will be replaced (now: {now})"


USAGE = (
    "python -m metalearn.evaluate RUN_DIR [--which best|latest|init] [--out PATH] [key=value ...]"
)


class _OneLineParser(OneLineParser):
    """The tools' one-line parser, naming what evaluate needs when the run is missing."""

    def error(self, message: str) -> NoReturn:
        if "required: run_dir" in message:  # argparse also names the optional overrides there
            message = "name the run directory to evaluate"
        super().error(message)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = _OneLineParser(description=__doc__.splitlines()[0], usage=USAGE)
    parser.add_argument("run_dir")
    parser.add_argument("--which", choices=["best", "latest", "init"], default="best")
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_intermixed_args(argv)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    try:
        load_plugins()  # the run's own algorithm, model or task family, if it has one
        if args.out is not None:  # before the evaluation; never over the run's own records
            # eval_*.json are this command's outputs, to replace in the run evaluated only:
            # another run's eval_best.json would hold this run's numbers under its name.
            here = os.path.realpath(os.path.dirname(os.path.abspath(args.out)))
            own = here == os.path.realpath(args.run_dir)
            check_output_file(
                args.out,
                "--out",
                f"eval_{args.which}.json",
                allowed=OWN_OUTPUTS if own else (),
                note=False,
            )
        runner, params = load_run(args.run_dir, args.which, args.overrides)
        out = args.out or os.path.join(args.run_dir, f"eval_{runner.loaded}.json")
        check_writable_file(out, "--out", "eval.json")
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # raised in a researcher's own registered code: one line
        message = user_code_error(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    replaced = replacement_note(out, args.overrides)
    if replaced:
        print(replaced, file=sys.stderr)
    cfg = runner.cfg
    num_tasks = cfg.eval.num_tasks
    print(
        f"evaluating on {num_tasks} test tasks at shots {cfg.eval.shots} (the first call compiles)",
        file=sys.stderr,
    )
    progress = EvaluationProgress(num_tasks)
    try:
        records = runner.evaluate(params, "test", num_tasks, on_chunk=progress)
    except Exception as err:
        message = out_of_memory_message(err, "lower eval.tasks_per_call (tasks per call)")
        message = message or user_code_error(err, selected_parts(cfg))
        if not message:
            raise
        progress.close()
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    finally:
        progress.close()
        runner.close()
    print(f"evaluated the {runner.loaded} checkpoint (step {runner.loaded_step})")
    for r in records:
        r.update(
            checkpoint=runner.loaded,
            checkpoint_step=runner.loaded_step,
            overrides=list(args.overrides),
        )
    with open(out + ".tmp", "w") as f:
        json.dump(records, f, indent=2)
    os.replace(out + ".tmp", out)
    for r in records:
        print(format_record(r))
    print(f"wrote {out}")
    return records


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the results are written at the end, in one atomic replace
        print("interrupted by SIGINT: nothing was written", file=sys.stderr)
        exit_at_once(130)  # not after the XLA compilation the signal interrupted
