"""Running the command-line entry points, as a user does, and reading the result: in a
subprocess where the process itself is under test (signals, exit, imports), else in this one."""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

import pytest
from absl import logging as absl_logging

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = ["+experiment=sinusoid_maml", "+debug=tiny"]
OMNIGLOT_TINY = ["+experiment=omniglot_5w1s_cpu", "+debug=tiny"]
# MAML-RL on 2D navigation, small enough to compile and run in seconds: 2 rollouts per step,
# an 8-unit policy, 2 CG iterations; evaluation after 0-3 inner steps on 4 tasks.
RL_TINY = [
    "+experiment=rl_nav2d_maml",
    "+debug=tiny",
    "data.rollouts=2",
    "algorithm.post_rollouts=2",
    "algorithm.eval_rollouts=2",
    "algorithm.cg_iters=2",
    "model.hidden_sizes=[8]",
    "eval.steps=[0,1,2,3]",
]


def checkout_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with this checkout first on the import path."""
    environ = dict(os.environ if env is None else env)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")])
    return environ


def tail(text: str | bytes | None, chars: int = 4000) -> str:
    """The end of a process's output, for a failure message."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-chars:]


def finished(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command)``, its output captured; ``timeout`` is a safety limit only (a
    hung command), which fails the test saying what it waited for and the output so far."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as err:
        output = tail(err.stdout) + tail(err.stderr)
        pytest.fail(f"waited {timeout} s for {' '.join(command)} to exit; last output:\n{output}")


def communicated(proc: subprocess.Popen, timeout: float) -> tuple:
    """``proc.communicate()``: its remaining output; ``timeout`` is a safety limit only (a hung
    process, then killed), which fails the test naming the command and its output so far."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        command = " ".join(str(a) for a in proc.args) if isinstance(proc.args, list) else proc.args
        pytest.fail(
            f"waited {timeout} s for {command} to exit: killed; last output:\n"
            f"{tail(out)}{tail(err)}"
        )


def run_cli(*args: str, module: str = "metalearn.train", cwd=None, env=None, timeout=600):
    """``python -m module args...`` with this checkout first on the import path."""
    command = [sys.executable, "-m", module, *args]
    return finished(command, timeout, cwd=cwd or REPO, env=checkout_env(env))


def run_in_process(*args: str, module: str = "metalearn.train", env: dict | None = None):
    """What :func:`run_cli` returns, from ``module``'s ``main(argv)`` called in this process
    (``env``: variables set for the call): an exception the entry lets out is a traceback on
    stderr and exit status 1, as Python's would be."""
    # Hydra's logging set-up closes every handler made before (logging.config.dictConfig), and
    # absl's then closes its stream unless it is sys.stderr: here pytest's capture.
    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                returned = importlib.import_module(module).main(list(args))
                code = returned if isinstance(returned, int) else 0
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for handler in set(root.handlers) - set(handlers):  # Hydra's logging of the run
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)
    return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())


def run_script(script: str, *args: str, timeout=600):
    """``python scripts/<script> args...`` from the repository root, importing this checkout."""
    command = [sys.executable, str(REPO / "scripts" / script), *args]
    return finished(command, timeout, cwd=REPO, env=checkout_env())


def run_tool(name: str, *args: str):
    """``python -m metalearn.tools.<name> args...`` (a tool shipped in the package), run in
    this process (:func:`run_in_process`; tests/test_entry_points.py starts each as a process)."""
    return run_in_process(*args, module=f"metalearn.tools.{name}")


def error_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Check exit status 2, no traceback, exactly one ``error:`` line containing ``fragments``."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, f"exit {result.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr[-4000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# How long a test waits for an event of a process (a line, a file, its exit) before it fails,
# saying what it waited for: a safety limit against a hang, never a claim on the machine's speed.
SAFETY_LIMIT_S = 300


class Watched:
    """A running process (stdout and stderr merged, as text) whose output is read on a thread,
    so that a test can wait for a line or a condition, with a safety limit that reports."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines, self._closed = proc, [], False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def _fail(self, waited: str) -> None:
        """Fail the test saying what it waited for, the process ended (killed if it ran on:
        left running, it would hold a core for the rest of the tests)."""
        if self._closed:  # its output ended: it is exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        status = self.proc.poll()
        if status is None:
            self.proc.kill()
            self.proc.wait()
            self._reader.join()
        ended = "still running: killed" if status is None else f"exit status {status}"
        pytest.fail(f"{waited}; {ended}; last output:\n{tail(self.output)}")

    def wait_for_line(self, marker: str, limit_s: float = SAFETY_LIMIT_S) -> str:
        """The first line containing ``marker``, once printed."""

        def found() -> str | None:
            return next((line for line in self.lines if marker in line), None)

        with self._changed:
            self._changed.wait_for(lambda: found() or self._closed, timeout=limit_s)
            line = found()
        if line is None:
            ended = "the process ended" if self._closed else f"waited {limit_s} s"
            self._fail(f"{ended} before a line containing {marker!r}")
        return line

    def wait_until(self, what: str, done: Callable[[], bool], limit_s=SAFETY_LIMIT_S) -> None:
        """Until ``done()``, polled every 50 ms while the process runs; ``what`` names it."""
        deadline = time.monotonic() + limit_s  # a safety limit only
        while not done():
            if self.proc.poll() is not None and not done():
                self._fail(f"the process ended before {what}")
            if time.monotonic() > deadline:
                self._fail(f"waited {limit_s} s for {what}")
            time.sleep(0.05)

    def exit(self, after: str, limit_s: float = SAFETY_LIMIT_S) -> str:
        """Wait for the process to exit (killing it past ``limit_s``); all of its output.
        ``after`` says what it should exit after, for the failure message."""
        try:
            self.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self._fail(f"waited {limit_s} s for the process to exit after {after}")
        self._reader.join()
        return self.output
