"""Hydra's submitit launcher: the cluster config composes, and a local submitit sweep runs."""

import os
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from metalearn.train import CONF_DIR
from tests.cli import checkout_env


def test_slurm_launcher_config_composes():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(
            config_name="config",
            overrides=["+experiment=sinusoid_maml", "hydra/launcher=cluster"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.gpus_per_node == 1 and launcher.tasks_per_node == 1


def test_sweep_through_submitit_runs_each_job(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "metalearn.train",
            "-m",
            "hydra/launcher=local_cluster",
            "+experiment=sinusoid_maml",
            "+debug=tiny",
            "seed=0,1",
            f"hydra.sweep.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=checkout_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name.split("_")[0] for p in runs] == ["0", "1"]
    assert all((p / "eval.json").exists() for p in runs)


def sweep(tmp_path, *overrides, env=None):
    return subprocess.run(
        [sys.executable, "-m", "metalearn.train", "-m", "+experiment=sinusoid_maml", "+debug=tiny"]
        + [*overrides, f"hydra.sweep.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=checkout_env({**os.environ, **(env or {})}),
    )


def one_error_line(result, code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.skipif(shutil.which("srun") is not None, reason="on SLURM this submits a real job")
def test_the_slurm_launcher_outside_slurm_is_one_line(tmp_path):
    # A 39-line traceback ending in submitit's RuntimeError before.
    line = one_error_line(sweep(tmp_path, "hydra/launcher=cluster"), 2)
    assert "this launcher submits to SLURM, but srun is not found here" in line
    assert "hydra/launcher=local_cluster" in line


# A job killed from outside (the OOM killer, scancel, preemption): here by a plugin module that
# every job imports (METALEARN_PLUGINS), which also shows that jobs import the plugins.
KILLED_IN_JOBS = """
import os
import signal

if "SUBMITIT_LOCAL_JOB_ID" in os.environ:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_job_killed_from_outside_is_one_line(tmp_path):
    # submitit's UncompletedJobError ended the sweep in a traceback through Hydra.
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "killed_in_jobs.py").write_text(KILLED_IN_JOBS)
    env = {"PYTHONPATH": str(plugins), "METALEARN_PLUGINS": "killed_in_jobs"}
    line = one_error_line(sweep(tmp_path / "s", "hydra/launcher=local_cluster", env=env), 1)
    assert "a sweep job ended without a result, killed from outside (submitit: Job " in line
    assert "has not produced any output" in line and "rerun the same command" in line
