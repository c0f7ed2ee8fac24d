"""Evaluate a saved checkpoint on its own: ``python -m metalearn.evaluate RUN_DIR``.

Evaluates the best-on-validation parameters (or ``--which latest|init``) on the test split and
writes the ``eval.json`` records, with the checkpoint, its step and the overrides, to
``RUN_DIR/eval_<which>.json`` (or ``--out``). ``key=value`` overrides the saved config's settings,
except those read in training only.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from metalearn.cli import OneLineParser, check_output_file, check_writable_file
from metalearn.registry import load_plugins, selected_parts, user_code_error
from metalearn.runner.devices import out_of_memory_message
from metalearn.runner.evaluation import format_record
from metalearn.runner.reporting import EvaluationProgress
from metalearn.runner.rundir import write_atomically
from metalearn.runner.saved_run import load_run
from metalearn.runner.signals import (
    Interrupted,
    StopRequest,
    exit_at_once,
    interruption_behind,
)


def replacement_note(out: str, overrides: Sequence[str]) -> str | None:
    """A line saying that the evaluation file ``out``, made with other overrides than
    ``overrides`` (or not saying which), will be replaced; None when there is nothing to say."""
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
            # Its own eval_*.json only in the run evaluated, not another run's.
            here = os.path.realpath(os.path.dirname(os.path.abspath(args.out)))
            own = ("eval_*.json",) if here == os.path.realpath(args.run_dir) else ()
            check_output_file(args.out, "--out", f"eval_{args.which}.json", own, note=False)
        runner, params = load_run(args.run_dir, args.which, args.overrides)
        out = args.out or os.path.join(args.run_dir, f"eval_{runner.loaded}.json")
        check_writable_file(out, "--out", "eval.json")
    except Exception as err:  # or raised in a researcher's own registered code: one line
        _raise_the_interruption_behind(err)
        known = isinstance(err, (ValueError, FileNotFoundError, RuntimeError))
        message = str(err) if known else user_code_error(err)
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
        (records,) = runner.evaluate(params, "test", num_tasks, on_chunk=progress)
    except Exception as err:
        _raise_the_interruption_behind(err)
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
    write_atomically(out, json.dumps(records, indent=2))
    for r in records:
        print(format_record(r))
    print(f"wrote {out}")
    return records


def _raise_the_interruption_behind(err: Exception) -> None:
    """A signal's Interrupted that a library turned into an error of its own is the signal's."""
    interrupted = interruption_behind(err)
    if interrupted is not None:
        raise interrupted from err


if __name__ == "__main__":
    try:
        # The training loop's signal handling: a SIGINT landing in a garbage-collection callback
        # (JAX's run during compilation) is delivered again, not printed and dropped.
        with StopRequest():
            main()
    except (KeyboardInterrupt, Interrupted) as err:  # the results are written at the end, at once
        stopped = err if isinstance(err, Interrupted) else Interrupted(signal.SIGINT)
        print(f"interrupted by {stopped.name}: nothing was written", file=sys.stderr)
        exit_at_once(stopped.exit_code)  # not after the XLA compilation the signal interrupted
