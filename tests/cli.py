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
import traceback

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


def run_cli(*args: str, module: str = "metalearn.train", cwd=None, env=None, timeout=600):
    """``python -m module args...`` with this checkout first on the import path."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env=checkout_env(env),
    )


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
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=checkout_env(),
    )


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
