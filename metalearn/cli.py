"""What the command-line entries share: every bad input ends in one ``error:`` line saying what
is wrong and what to do, exit status 2, where Hydra and argparse print blocks of text (and Hydra
advises ``+key=...`` for a misspelt key, adding one nothing reads).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from metalearn.config.compose import RENAMED, name_key_group, selectable
from metalearn.data.sources import DataSourceError
from metalearn.registry import GROUPS, user_code_error
from metalearn.runner.devices import out_of_memory_message
from metalearn.runner.layout import RUN_STORES, RunDirectoryError, no_space_message, run_record
from metalearn.runner.run import NonFiniteError
from metalearn.runner.sweeps import ERROR_DETAILS


def command_line_problem(argv: Sequence[str], experiments: Sequence[str]) -> str | None:
    """The first override of ``argv`` that selects what is no option (a ``base_*`` experiment,
    a group's ``name`` key), or None; ``experiments``: the selectable ones.

    >>> command_line_problem(["+experiment=base_sinusoid"], ["sinusoid_maml"])
    'experiment=base_sinusoid holds what several experiments share and is not one to run; choose one of: sinusoid_maml'
    >>> command_line_problem(["algorithm.name=reptile"], [])
    'algorithm.name=reptile: choose the algorithm with algorithm=reptile (its option sets its name and settings)'
    >>> command_line_problem(["+experiment=sinusoid_maml", "seed=1", "name=mine"], []) is None
    True
    """  # noqa: E501
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            continue
        if key.lstrip("+~") == "experiment":
            for name in value.split(","):
                if name.strip().startswith("base_"):
                    return (
                        f"experiment={name.strip()} holds what several experiments share and is "
                        f"not one to run; choose one of: {', '.join(experiments)}"
                    )
        group = name_key_group(key)
        if group:
            return (
                f"{key.lstrip('+~')}={value}: choose the {group} with {group}={value} (its option "
                "sets its name and settings)"
            )
    return None


def renamed_key_errors(overrides: list[str]) -> list[str]:
    """One message per command-line override that uses a renamed key.

    >>> renamed_key_errors(["seed=1", "algorithm.num_steps=5"])
    ['algorithm.num_steps was renamed algorithm.inner_steps']
    """
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    return [f"{key} was renamed {RENAMED[key]}" for key in keys if key in RENAMED]


def unset_part_errors(overrides: list[str], groups: list[str]) -> list[str]:
    """One message per override that sets a config group to ``null`` or deletes a top-level entry.

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
            if name in ("experiment", "debug"):  # appended with +NAME=..., absent by default
                errors.append(f"{name}=null: to run without {name}, leave the override out")
            else:
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


def exit_on_renamed_keys(
    argv: list[str], groups: Sequence[str] = (), experiments: Sequence[str] = ()
) -> None:
    """One ``error:`` line and exit 2 if an override in ``argv`` uses a renamed key, leaves out
    a part a run needs (``groups``: the config groups) or is a :func:`command_line_problem`."""
    errors = renamed_key_errors(argv) + unset_part_errors(argv, list(groups))
    problem = command_line_problem(argv, experiments)
    if errors or problem:
        print(f"error: {'; '.join(errors) or problem}", file=sys.stderr)
        sys.exit(2)


TRAIN_USAGE = (
    "python -m metalearn.train [-m] +experiment=NAME [key=value ...] (--hydra-help lists "
    "Hydra's flags)"
)
# Hydra's flags that take no value; argparse refuses them between two overrides.
BARE_FLAGS = ("-m", "--multirun", "--resolve")


def bare_flags_first(argv: list[str]) -> list[str]:
    """``argv`` with Hydra's value-less flags moved before the overrides.

    >>> bare_flags_first(["+experiment=sinusoid_maml", "-m", "seed=0,1"])
    ['-m', '+experiment=sinusoid_maml', 'seed=0,1']
    """
    return [a for a in argv if a in BARE_FLAGS] + [a for a in argv if a not in BARE_FLAGS]


def debug_after_experiment(argv: list[str]) -> list[str]:
    """``argv`` with ``+debug=...`` after ``+experiment=...``: Hydra merges the appended groups
    in command-line order, so a debug preset written first would be overwritten.

    >>> debug_after_experiment(["+debug=tiny", "+experiment=sinusoid_maml", "seed=1"])
    ['+experiment=sinusoid_maml', '+debug=tiny', 'seed=1']
    """
    debug = [a for a in argv if a.lstrip("+").startswith("debug=")]
    rest = [a for a in argv if a not in debug]
    experiments = [i for i, a in enumerate(rest) if a.lstrip("+").startswith("experiment=")]
    if not debug or not experiments or argv.index(debug[0]) > argv.index(rest[experiments[-1]]):
        return argv
    return rest[: experiments[-1] + 1] + debug + rest[experiments[-1] + 1 :]


def check_flags(argv: list[str]) -> None:
    """One ``error:`` line and exit 2 for a flag Hydra's command line does not take."""
    if any(a in ("-h", "--help", "--hydra-help", "--version") for a in argv):
        return  # Hydra prints these itself
    parser = OneLineParser(usage=TRAIN_USAGE, add_help=False)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    for flags in ("--resolve", "--run -r", "--multirun -m", "--shell-completion -sc"):
        parser.add_argument(*flags.split(), action="store_true")
    for flags in ("--package -p", "--config-path -cp", "--config-name -cn", "--config-dir -cd"):
        parser.add_argument(*flags.split())
    parser.add_argument("--experimental-rerun")
    info = ["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"]
    parser.add_argument("--info", "-i", nargs="?", const="all", choices=info)
    parser.parse_args(argv)


def selectable_options_only(help_text: str) -> str:
    """Hydra's ``--help`` listing only the group options a command line may select.

    >>> print(selectable_options_only("algorithm: anil, anil_schema\\nexperiment: base_rl, x"))
    algorithm: anil
    experiment: x
    """
    lines = []
    for line in help_text.split("\n"):
        group, colon, options = line.partition(": ")
        if colon and group in (*GROUPS, "experiment") and "," in options:
            kept = [o for o in options.split(", ") if selectable(group, o)]
            line = f"{group}: {', '.join(kept)}"
        lines.append(line)
    return "\n".join(lines)


def launcher_error(err: RuntimeError) -> tuple[str, int] | None:
    """One line and an exit status for what Hydra's submitit launcher raises; else None.

    >>> launcher_error(RuntimeError('Could not detect "srun", are you indeed on a slurm cluster?'))[1]
    2
    """  # noqa: E501
    text = str(err).splitlines()[0] if str(err) else ""
    if 'Could not detect "srun"' in text:
        return (
            "this launcher submits to SLURM, but srun is not found here (submitit: "
            f"{text}); run the sweep on a SLURM login node, or use hydra/launcher=local_cluster "
            "(submitit on this machine) or no launcher"
        ), 2
    if type(err).__name__ == "UncompletedJobError":  # killed, preempted or out of memory
        where = "the same hydra.sweep.dir (the directory above .submitit/ in this line)"
        flat = " ".join(str(err).split())
        first = re.search(r"Job .*?\(state: [^)]*\)", flat)
        log_file = re.search(r"Look at std(?:out|err): (\S+)", flat)
        reason = (first.group(0) if first else flat[:200]) + (
            f"; its log: {log_file.group(1)}" if log_file else ""
        )
        return (
            f"a sweep job ended without a result, killed from outside (submitit: {reason}); "
            f"the jobs that finished keep their results: rerun the same command with {where} "
            "to run the others again, each from its last checkpoint"
        ), 1
    return None


def command_line_record(cfg: Any) -> dict[str, str]:
    """The resolved ``config.yaml`` and the ``.hydra/`` files Hydra would write, for the run
    directory to write once it accepts the run; called while Hydra holds the job's config."""
    return {
        "config.yaml": OmegaConf.to_yaml(cfg, resolve=True),
        ".hydra/config.yaml": OmegaConf.to_yaml(cfg),
        ".hydra/hydra.yaml": OmegaConf.to_yaml(HydraConfig.instance().cfg),
        ".hydra/overrides.yaml": OmegaConf.to_yaml(HydraConfig.get().overrides.task),
    }


@dataclasses.dataclass
class Failure:
    """How a run failed: one ``error:`` line, an exit status, the status its sweep job records
    (``refused``: its directory is as it was), the traceback for ``error.txt`` (``details``);
    ``exit_now``: end at once, exit handlers skipped."""

    message: str
    code: int = 2
    status: str = "failed"
    details: str = ""
    exit_now: bool = False


def failure_of(err: BaseException, workdir: str, hint: str, selected: dict) -> Failure | None:
    """The :class:`Failure` of a run that raised ``err``; None for an error of the library itself.
    ``hint``: what to rerun to resume; ``selected``: the parts the run used."""
    if isinstance(err, RunDirectoryError):
        return Failure(f"error: {err}", status="refused")
    if isinstance(err, (ValueError, FileNotFoundError, NonFiniteError, DataSourceError)):
        # Raised in the researcher's own code (not merely while their part was in use)?
        in_user_code = user_code_error(err) if isinstance(err, ValueError) else None
        if not in_user_code:
            return Failure(f"error: {err}")
    else:
        out_of_memory = out_of_memory_message(err)
        if out_of_memory:
            return Failure(f"error: {out_of_memory}")
        no_space = no_space_message(err, workdir, hint)
        if no_space:  # writes still buffered would fail again at exit, each noisily: skip it
            return Failure(f"error: {no_space}", exit_now=True)
        in_user_code = user_code_error(err, selected)
        if not in_user_code:
            return None
    return Failure(  # the traceback goes to error.txt
        f"error: {in_user_code}; the traceback is in {workdir}/{ERROR_DETAILS}",
        details="".join(traceback.format_exception(err)),
    )


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one ``error:`` line ending with the usage, exit status 2.

    >>> parser = OneLineParser(prog="python -m metalearn.tools.x")
    >>> _ = parser.add_argument("run_dir")
    >>> parser.one_line_usage()
    'python -m metalearn.tools.x [-h] run_dir'
    """

    def one_line_usage(self) -> str:
        return " ".join(self.format_usage().split()).removeprefix("usage: ")

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; usage: {self.one_line_usage()}", file=sys.stderr)
        sys.exit(2)


def exit_status(work: Callable[[], object]) -> int:
    """Run a tool's ``work``: 0, or one ``error:`` line and 2 for FileNotFoundError or ValueError.

    >>> exit_status(lambda: None)
    0
    """
    try:
        work()
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def check_writable_file(path: str | os.PathLike, flag: str, example: str) -> None:
    """Raise ValueError (one line) unless ``path`` can be written as a file; ``flag`` names the
    option, ``example`` is a file name for the advice when ``path`` is a directory.

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


def check_output_file(
    path: str | os.PathLike,
    flag: str,
    example: str,
    allowed: Sequence[str] = (),
    note: bool = True,
) -> None:
    """:func:`check_writable_file`, and refuse a ``path`` that would replace a record of a run;
    with ``note``, say on stderr when it replaces another existing file."""
    check_writable_file(path, flag, example)
    record = run_record(path, allowed)
    if record is not None:
        directory = os.path.dirname(os.fspath(path)) or "."
        while os.path.basename(os.path.abspath(directory)) in RUN_STORES:  # not in .hydra/
            directory = os.path.dirname(os.path.abspath(directory))
        shown = os.path.join(directory, example)
        raise ValueError(
            f"{flag} {path} is {record}: writing there would destroy it. Nothing was written. "
            f"Give a new file name, e.g. {shown}"
        )
    if note and os.path.isfile(path):
        print(f"note: {flag} {path} exists: it will be replaced", file=sys.stderr)
