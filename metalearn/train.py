"""Hydra entry point: ``python -m metalearn.train +experiment=NAME [key=value ...]``.

Everything lands in the Hydra run directory (``outputs/<name>/<time>/`` by default, or
``multirun/...`` with ``-m``): the resolved ``config.yaml``, ``metrics.jsonl``, TensorBoard
events, orbax checkpoints and ``eval.json``. Rerunning with ``hydra.run.dir=<that directory>``
resumes from its latest checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import signal
import sys
import traceback
from typing import NoReturn

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from metalearn.config import (
    check_group_choices,
    check_writable,
    exit_on_renamed_keys,
    register_configs,
    to_objects,
)
from metalearn.config_errors import command_line_problem, composition_error_message, selectable
from metalearn.data.sources import DataSourceError
from metalearn.registry import (
    GROUPS,
    PluginError,
    load_plugins,
    selected_parts,
    user_code_error,
)
from metalearn.runner.compilation_cache import enable_compilation_cache
from metalearn.runner.cpu_backend import schedule_lapack_calls_serially, start_cpu_devices
from metalearn.runner.devices import (
    initialize_distributed,
    is_primary_host,
    out_of_memory_message,
)
from metalearn.runner.experiment import cpu_devices_for, needs_serial_lapack
from metalearn.runner.loop import NonFiniteError, prepare_run_directory, train_and_evaluate
from metalearn.runner.rundir import (
    RunDirectoryError,
    no_space_message,
    record_kept_unless_trained,
    resume_hint,
    run_directory_held,
)
from metalearn.runner.signals import exit_at_once, hand_back_to_launcher, requeue_signal
from metalearn.runner.sweeps import ERROR_DETAILS, record_job, write_error_details
from metalearn.tools import usage_error

# The Hydra configs ship inside the package (metalearn/conf/), so a wheel install runs too.
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
log = logging.getLogger("metalearn")
_task_started = False  # set once Hydra has composed the config and calls main()

try:  # a researcher's own algorithms, models and task families register before the configs
    load_plugins()
except PluginError as _err:
    if __name__ != "__main__":
        raise
    print(f"error: {_err}", file=sys.stderr)
    sys.exit(2)
register_configs()
# Orbax reports every save and restore at INFO through absl, JAX opens every run with an INFO
# line about the TPU backend it did not find, and torch (imported by tensorboardX where it is
# installed) logs its FakeTensor cache statistics at exit; keep the run log readable.
for _name in ("absl", "jax._src.xla_bridge", "torch"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def run(cfg: DictConfig, workdir: str) -> dict:
    """Validate ``cfg``, write it resolved to ``workdir/config.yaml``, train and evaluate.

    A directory that holds a run with another config is refused before anything is written.
    """
    config = to_objects(cfg)
    start_cpu_devices(cpu_devices_for(config))  # before any computation, like the three below
    if needs_serial_lapack(config):
        schedule_lapack_calls_serially()
    enable_compilation_cache(config.trainer.compilation_cache)  # before any computation
    check_writable(workdir)
    d = config.distributed
    initialize_distributed(d.enabled, d.coordinator_address, d.num_processes, d.process_id)
    # One process trains in a directory at a time (the hosts of one distributed run: one).
    with run_directory_held(workdir) if is_primary_host() else contextlib.nullcontext():
        prepare_run_directory(config, workdir)
        path = os.path.join(workdir, "config.yaml")
        partial = f"{path}.{os.getpid()}.tmp"  # never a half-written config.yaml (one per host)
        with open(partial, "w") as f:
            f.write(OmegaConf.to_yaml(cfg, resolve=True))
        os.replace(partial, path)
        return train_and_evaluate(config, workdir)


@hydra.main(version_base=None, config_path="pkg://metalearn.conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """One run; in a sweep (``-m``) a failing job is recorded and the sweep goes on."""
    global _task_started
    _task_started = True
    hydra_cfg = HydraConfig.get()
    workdir = hydra_cfg.runtime.output_dir
    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        # Hydra has rewritten .hydra/ already: a refusal or failure before a checkpoint is saved
        # puts the run's record back, so the directory still says what its run was.
        with record_kept_unless_trained(workdir) as ending:
            load_plugins()  # again in a job of its own process (a submitit launcher's)
            check_group_choices(hydra_cfg.runtime.choices, _group_options())
            summary = run(cfg, workdir)
            ending.interrupted = summary["interrupted"]
    except RunDirectoryError as err:
        return _failed(workdir, sweep, f"error: {err}", 2, status="refused")
    except (ValueError, FileNotFoundError, NonFiniteError, DataSourceError) as err:
        # Raised by the researcher's own code (their file and line; not merely while a part of
        # theirs was in use: the library's own ValueErrors say what is wrong themselves).
        in_user_code = user_code_error(err) if isinstance(err, ValueError) else None
        if in_user_code:
            return _failed_in_user_code(in_user_code, workdir, sweep)
        return _failed(workdir, sweep, f"error: {err}", 2)
    except Exception as err:
        out_of_memory = out_of_memory_message(err)
        if out_of_memory:
            return _failed(workdir, sweep, f"error: {out_of_memory}", 2)
        no_space = no_space_message(err, workdir)
        if no_space:  # TensorBoard's exit handler would flush into the full disk again: skip it
            _failed(workdir, sweep, f"error: {no_space}", 2, exit_now=True)
        in_user_code = user_code_error(err, selected_parts(cfg))
        if in_user_code:
            return _failed_in_user_code(in_user_code, workdir, sweep)
        if not sweep:
            raise
        message = f"error: {type(err).__name__}: {err}".splitlines()[0]
        return _failed(workdir, sweep, message, 1, traceback.format_exc())
    if summary["interrupted"]:
        code = 128 + summary["signal"]
        if sweep:
            record_job(workdir, "interrupted", code, f"stopped by signal {summary['signal']}")
        if summary.get("requeue"):
            _requeue(workdir, summary["step"])
        # What was saved is said; end now, in a sweep too (a signal stops its remaining jobs;
        # a job of submitit's launcher ends without a result, as a killed one does). Python's
        # normal exit waits for an XLA compilation the signal interrupted, which runs on
        # (minutes for a long unrolled inner loop), and then may free what it still uses.
        exit_at_once(code)
    if sweep:
        record_job(workdir, "ok")
    return summary["best_val_score"]


def _requeue(workdir: str, step: int) -> None:
    """Hand the requeue signal back to submitit, the checkpoint saved: it requeues the job
    (which resumes from ``step``) and this process ends with submitit's exit status. Where it
    cannot (timed out ``max_num_timeout`` times), say so; the caller ends the job."""
    signum = requeue_signal()
    assert signum is not None  # only a submitit job's StopRequest reports a requeue
    record_job(
        workdir, "requeued", 0, f"stopped at step {step} by {signal.Signals(signum).name}; requeued"
    )
    try:
        not_requeued = hand_back_to_launcher(signum)
    except SystemExit as requeued:
        log.warning("submitit requeued the job; it resumes from step %d", step)
        code = requeued.code if isinstance(requeued.code, int) else 1
        exit_at_once(code % 256)
    if not_requeued:  # None: a task other than the first, which requeues the job
        message = f"stopped at step {step}; not requeued: {not_requeued}"
        record_job(workdir, "interrupted", 128 + signum, message)
        log.warning("%s; %s", message, resume_hint(workdir))


def _failed_in_user_code(in_user_code: str, workdir: str, sweep: bool) -> None:
    """An error in a researcher's own algorithm, model, task family or environment: the one
    line of :func:`metalearn.registry.user_code_error` naming their code or part; the
    traceback of the exception being handled goes to the run directory's ``error.txt``."""
    details = traceback.format_exc()
    if not sweep:  # a sweep's job writes it with its status record
        with contextlib.suppress(OSError):
            write_error_details(workdir, details)
    message = f"error: {in_user_code}; the traceback is in {workdir}/{ERROR_DETAILS}"
    return _failed(workdir, sweep, message, 2, details)


def _failed(
    workdir: str,
    sweep: bool,
    message: str,
    code: int,
    details: str = "",
    status: str = "failed",
    exit_now: bool = False,
) -> None:
    """Report a failed run: exit with ``code``, or in a sweep record it and let the sweep go on.

    ``status="refused"``: the run directory refused the job, so nothing in it changed (its
    earlier record is kept inside the new one, and no ``error.txt`` is written).
    ``exit_now``: exit at once without exit handlers, in a sweep too (a full disk)."""
    print(message, file=sys.stderr)
    if exit_now:  # without exit handlers; nothing can be recorded either
        exit_at_once(code)
    if not sweep:
        sys.exit(code)
    if status == "refused":
        record_job(workdir, status, code, message)
    else:
        record_job(workdir, status, code, message, details or message + "\n")
    return None


def _stopped_early(signum, frame) -> None:
    """A signal before the run has started (Hydra composing the config): one line, no trace."""
    print(f"interrupted by {signal.Signals(signum).name} before training started", file=sys.stderr)
    sys.exit(128 + signum)


def _group_options() -> dict[str, list[str]]:
    """The options of each config group, as Hydra sees them (schema entries included)."""
    loader = GlobalHydra.instance().config_loader()
    return {g: loader.get_group_options(g) for g in GROUPS}


def _main_with_one_line_errors() -> None:
    """Run :func:`main`; a command line Hydra cannot compose ends in one ``error:`` line, exit 2.

    Hydra prints its own multi-line report unless ``HYDRA_FULL_ERROR`` is set, in which case it
    raises; a user who set it gets Hydra's full traceback as before.
    """
    if "HYDRA_FULL_ERROR" in os.environ:
        main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except (HydraException, OmegaConfBaseException) as err:
        if _task_started:  # raised by the run itself, not by Hydra composing the command line
            raise
        print(f"error: {composition_error_message(err)}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as err:  # raised by a submitit launcher, outside any job
        found = None if _task_started else _launcher_error(err)
        if found is None:
            raise
        message, code = found
        print(f"error: {message}", file=sys.stderr)
        sys.exit(code)


def _launcher_error(err: RuntimeError) -> tuple[str, int] | None:
    """One line and an exit status for what Hydra's submitit launcher raises; else None.

    >>> _launcher_error(RuntimeError('Could not detect "srun", are you indeed on a slurm cluster?'))[1]
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


# Hydra's flags that take no value; argparse refuses them between two overrides.
_BARE_FLAGS = ("-m", "--multirun", "--resolve")


def _bare_flags_first(argv: list[str]) -> list[str]:
    """``argv`` with Hydra's value-less flags moved before the overrides.

    >>> _bare_flags_first(["+experiment=sinusoid_maml", "-m", "seed=0,1"])
    ['-m', '+experiment=sinusoid_maml', 'seed=0,1']
    """
    return [a for a in argv if a in _BARE_FLAGS] + [a for a in argv if a not in _BARE_FLAGS]


def _debug_after_experiment(argv: list[str]) -> list[str]:
    """``argv`` with ``+debug=...`` after ``+experiment=...``: Hydra merges the appended groups
    in command-line order, so a debug preset written first was overwritten by the experiment,
    silently (``+debug=tiny +experiment=sinusoid_maml`` ran the full 70,000 steps in a
    directory named ``...-debug=tiny``).

    >>> _debug_after_experiment(["+debug=tiny", "+experiment=sinusoid_maml", "seed=1"])
    ['+experiment=sinusoid_maml', '+debug=tiny', 'seed=1']
    """
    debug = [a for a in argv if a.lstrip("+").startswith("debug=")]
    rest = [a for a in argv if a not in debug]
    experiments = [i for i, a in enumerate(rest) if a.lstrip("+").startswith("experiment=")]
    if not debug or not experiments or argv.index(debug[0]) > argv.index(rest[experiments[-1]]):
        return argv
    return rest[: experiments[-1] + 1] + debug + rest[experiments[-1] + 1 :]


TRAIN_USAGE = (
    "python -m metalearn.train [-m] +experiment=NAME [key=value ...] (--hydra-help lists "
    "Hydra's flags)"
)


def _exit_on_bad_flags(argv: list[str]) -> None:
    """One ``error:`` line, exit 2, for a flag Hydra's parser refuses (it prints its usage)."""
    if any(a in ("-h", "--help", "--hydra-help", "--version") for a in argv):
        return  # Hydra prints these itself
    parser = get_args_parser()

    def error(message: str) -> NoReturn:
        usage_error(message, TRAIN_USAGE)

    parser.error = error  # type: ignore[method-assign]
    parser.parse_args(argv)


def _selectable_options_only(help_text: str) -> str:
    """Hydra's ``--help`` with the group options a command line may select: without the
    ``NAME_schema`` entries (the YAMLs' defaults, refused on the command line) and the
    ``base_*`` experiments (the parts the experiments share).

    >>> print(_selectable_options_only("algorithm: anil, anil_schema\\nexperiment: base_rl, x"))
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


def _config_groups() -> list[str]:
    """The config groups a command line selects from (``algorithm``, ..., ``experiment``)."""
    return sorted(
        name
        for name in os.listdir(CONF_DIR)
        if os.path.isdir(os.path.join(CONF_DIR, name)) and name not in ("hydra", "__pycache__")
    )


def _experiments() -> list[str]:
    """The experiments a command line may select (``+experiment=NAME``).

    >>> "sinusoid_maml" in _experiments() and "base_sinusoid" not in _experiments()
    True
    """
    names = os.listdir(os.path.join(CONF_DIR, "experiment"))
    return sorted(
        n.removesuffix(".yaml")
        for n in names
        if n.endswith(".yaml") and selectable("experiment", n.removesuffix(".yaml"))
    )


def _print_help() -> None:
    """Hydra's ``--help`` for this command line, listing only the options it may select."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            _main_with_one_line_errors()
    finally:  # Hydra exits (SystemExit) once it has printed the help
        print(_selectable_options_only(captured.getvalue()), end="")


if __name__ == "__main__":
    sys.argv[1:] = _debug_after_experiment(_bare_flags_first(sys.argv[1:]))
    _exit_on_bad_flags(sys.argv[1:])
    exit_on_renamed_keys(sys.argv[1:], _config_groups())
    _problem = command_line_problem(sys.argv[1:], _experiments())
    if _problem:
        print(f"error: {_problem}", file=sys.stderr)
        sys.exit(2)
    for _signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_signum, _stopped_early)
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        _print_help()
    else:
        _main_with_one_line_errors()
