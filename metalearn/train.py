"""Hydra entry point: ``python -m metalearn.train +experiment=NAME [key=value ...]``. Everything
lands in the Hydra run directory; rerunning with ``hydra.run.dir=<it>`` resumes from its latest
checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from metalearn import cli
from metalearn.config import check_group_choices, register_configs, to_objects
from metalearn.config.compose import composition_error_message, selectable
from metalearn.registry import PluginError, load_plugins, selected_parts
from metalearn.runner.cpu_backend import prepare_machine
from metalearn.runner.layout import resume_hint
from metalearn.runner.loop import train_and_evaluate
from metalearn.runner.signals import exit_at_once, hand_back_to_launcher, requeue_signal
from metalearn.runner.sweeps import record_job, write_error_details

CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
log = logging.getLogger("metalearn")
_task_started = False  # set once Hydra has composed the config and calls main()

# A sweep job in a process of its own (submitit) resolves its config with these resolvers.
register_configs()
# Orbax (through absl) and JAX's backend probe log noise at INFO.
for _name in ("absl", "jax._src.xla_bridge"):
    logging.getLogger(_name).setLevel(logging.WARNING)


@hydra.main(version_base=None, config_path="pkg://metalearn.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    """One run; in a sweep (``-m``) a failing job is recorded and the sweep goes on."""
    global _task_started
    _task_started = True
    hydra_cfg = HydraConfig.get()
    workdir = hydra_cfg.runtime.output_dir
    sweep_dir = str(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    hint = resume_hint(workdir, sweep_dir)
    if sweep_dir is not None:  # its train.log marks the job as started (runner.sweeps.JOB_MARKS)
        log.info("job %s of the sweep in %s", os.path.basename(workdir), sweep_dir)
    try:
        load_plugins()  # again in a job of its own process (a submitit launcher's)
        check_group_choices(hydra_cfg.runtime.choices)
        config = to_objects(cfg)
        prepare_machine(config)  # before any computation
        files = cli.command_line_record(cfg)
        summary = train_and_evaluate(config, workdir, files=files, sweep_dir=sweep_dir)
    except Exception as err:
        failure = cli.failure_of(err, workdir, hint, selected_parts(cfg))
        if failure is None and sweep_dir is None:
            raise
        if failure is None:
            message = f"error: {type(err).__name__}: {err}".splitlines()[0]
            failure = cli.Failure(message, 1, details=traceback.format_exc())
        return _failed(workdir, sweep_dir, failure)
    if summary["interrupted"]:
        code = 128 + summary["signal"]
        if sweep_dir is not None:
            record_job(workdir, "interrupted", code, f"stopped by signal {summary['signal']}")
        if summary.get("requeue"):
            _requeue(workdir, summary["step"], hint)
        # End now, in a sweep too (a signal stops its remaining jobs): Python's normal exit
        # waits for an XLA compilation the signal interrupted, which can run on for minutes.
        exit_at_once(code)
    if sweep_dir is not None:
        record_job(workdir, "ok")
    return summary["best_val_score"]


def _requeue(workdir: str, step: int, hint: str) -> None:
    """Hand the requeue signal back to submitit, the checkpoint saved: it requeues the job and
    this process ends with its exit status. Where it cannot, say so; the caller ends the job."""
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
        log.warning("%s; %s", message, hint)


def _failed(workdir: str, sweep_dir: str | None, failure: cli.Failure) -> None:
    """Report a failed run: exit with its status, or in a sweep record it (a refused job without
    ``error.txt``) and let the sweep go on, unless it must end at once (a full disk)."""
    print(failure.message, file=sys.stderr)
    if failure.exit_now:  # without exit handlers; nothing can be recorded either
        exit_at_once(failure.code)
    if sweep_dir is None:
        if failure.details:  # a sweep's job writes it with its status record
            with contextlib.suppress(OSError):
                write_error_details(workdir, failure.details)
        sys.exit(failure.code)
    details = "" if failure.status == "refused" else failure.details or failure.message + "\n"
    record_job(workdir, failure.status, failure.code, failure.message, details)


def _stopped_early(signum, frame) -> None:
    """A signal before the run has started (Hydra composing the config): one line, no trace."""
    # To the file descriptor: the signal may land inside a write to sys.stderr (reentrant).
    os.write(2, f"interrupted by {signal.Signals(signum).name} before training started\n".encode())
    sys.exit(128 + signum)


def _main_with_one_line_errors() -> None:
    """Run :func:`_hydra_main`; a command line Hydra cannot compose ends in one ``error:`` line,
    exit 2 (Hydra raises it under ``HYDRA_FULL_ERROR``; a user who set it gets the traceback)."""
    global _task_started
    _task_started = False
    if "HYDRA_FULL_ERROR" in os.environ:
        _hydra_main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _hydra_main()
    except (HydraException, OmegaConfBaseException) as err:
        if _task_started:  # raised by the run itself, not by Hydra composing the command line
            raise
        print(f"error: {composition_error_message(err)}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as err:  # raised by a submitit launcher, outside any job
        found = None if _task_started else cli.launcher_error(err)
        if found is None:
            raise
        print(f"error: {found[0]}", file=sys.stderr)
        sys.exit(found[1])
    finally:
        del os.environ["HYDRA_FULL_ERROR"]


# The config groups a command line may select or null (the package's conf/ directories).
GROUP_DIRS = sorted(
    name
    for name in os.listdir(CONF_DIR)
    if os.path.isdir(os.path.join(CONF_DIR, name)) and name not in ("hydra", "__pycache__")
)


def _options(group: str) -> list[str]:
    """The options a command line may select in ``group``, from the package's configs.

    >>> "sinusoid_maml" in _options("experiment") and "base_sinusoid" not in _options("experiment")
    True
    """
    files = os.listdir(os.path.join(CONF_DIR, group))
    names = [f.removesuffix(".yaml") for f in files if f.endswith(".yaml")]
    return sorted(n for n in names if selectable(group, n))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m metalearn.train ARGV...`` in this process; returns the exit status (the
    command line's own refusals, then Hydra). Ends the process at once where the command would
    (a stop by a signal, a full disk).

    >>> main(["+experiment=sinusoid_maml", "algorithm.num_steps=5"])
    2
    """
    argv = cli.debug_after_experiment(
        cli.bare_flags_first(list(sys.argv[1:] if argv is None else argv))
    )
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else "metalearn.train", *argv]
    try:
        try:  # a researcher's own algorithms, models and task families, before the configs
            load_plugins()
        except PluginError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        register_configs()  # the plugins' entries too
        cli.check_flags(argv)
        cli.exit_on_renamed_keys(argv, GROUP_DIRS, _options("experiment"))
        if not any(a in ("-h", "--help") for a in argv):
            _main_with_one_line_errors()
        else:  # Hydra's help, listing only the options a command line may select
            captured = io.StringIO()
            try:
                with contextlib.redirect_stdout(captured):
                    _main_with_one_line_errors()
            finally:  # Hydra exits (SystemExit) once it has printed the help
                print(cli.selectable_options_only(captured.getvalue()), end="")
    except SystemExit as exit:
        code = exit.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved_argv
    return 0


if __name__ == "__main__":
    for _signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_signum, _stopped_early)
    sys.exit(main())
