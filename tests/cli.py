"""Running the command-line entry points in a subprocess, as a user does, and reading the result."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

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


def run_tool(name: str, *args: str, timeout=600):
    """``python -m metalearn.tools.<name> args...`` (a tool shipped in the package), from the
    repository root, importing this checkout."""
    return run_cli(*args, module=f"metalearn.tools.{name}", timeout=timeout)


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
