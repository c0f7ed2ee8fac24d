"""Hydra's submitit launcher: the cluster config composes, and a local submitit sweep runs."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from metalearn.train import CONF_DIR
from tests.cli import checkout_env, communicated, finished


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
    result = finished(
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
        300,
        env=checkout_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name.split("_")[0] for p in runs] == ["0", "1"]
    assert all((p / "eval.json").exists() for p in runs)


def sweep(tmp_path, *overrides, env=None):
    return finished(
        [sys.executable, "-m", "metalearn.train", "-m", "+experiment=sinusoid_maml", "+debug=tiny"]
        + [*overrides, f"hydra.sweep.dir={tmp_path}"],
        300,
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


# The pid of every job process, for the test to signal it (a plugin module every job imports).
PID_IN_JOBS = """
import os

if "SUBMITIT_LOCAL_JOB_ID" in os.environ:
    with open(os.environ["JOB_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
"""
# 4000 fast meta-steps and no checkpoint before the end (the default checkpoint_every is
# 10,000): a requeue that does not save first starts the job again from its initialisation.
LONG_TINY = [
    "trainer.meta_steps=4000",
    "trainer.steps_per_call=50",
    "trainer.log_every=50",
    "trainer.checkpoint_every=4000",
    "trainer.eval_every=0",
    "seed=0",
]


def logged_steps(job: Path) -> list[tuple[int, str]]:
    lines = (job / "metrics.jsonl").read_text().splitlines()
    return [(json.loads(x)["step"], json.loads(x)["split"]) for x in lines]


def test_the_clusters_requeue_signal_saves_the_step_it_stopped_at_and_the_job_resumes(tmp_path):
    """SLURM warns a submitit job before its time limit (and at a pre-emption) with SIGUSR2;
    submitit's handler requeued the job and exited from inside the training step, so the
    requeued job repeated every step since the last periodic checkpoint (here all of them).
    Now the run stops after its current step, saves, and hands the signal back: submitit's
    local executor requeues the job as SLURM would, and it resumes from that step to exactly
    the result of a run that was not stopped."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "pid_in_jobs.py").write_text(PID_IN_JOBS)
    pids = tmp_path / "pids"
    env = {"PYTHONPATH": str(plugins), "METALEARN_PLUGINS": "pid_in_jobs", "JOB_PIDS": str(pids)}
    command = [sys.executable, "-m", "metalearn.train", "-m", "hydra/launcher=local_cluster"]
    command += ["+experiment=sinusoid_maml", "+debug=tiny", *LONG_TINY]
    proc = subprocess.Popen(
        [*command, f"hydra.sweep.dir={tmp_path / 'requeued'}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=checkout_env({**os.environ, **env}),
    )
    limit_s, sent_at = 300, None  # a safety limit only
    deadline = time.monotonic() + limit_s
    while sent_at is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        metrics = list((tmp_path / "requeued").glob("0_*/metrics.jsonl"))
        steps = [step for step, _ in logged_steps(metrics[0].parent)] if metrics else []
        if steps and max(steps) >= 1000:
            sent_at = max(steps)
            os.kill(int(pids.read_text().split()[0]), signal.SIGUSR2)
    if sent_at is None:
        proc.kill()
    output = communicated(proc, 300)[0]
    waited = f"waited up to {limit_s} s for job 0 to log step 1000 (exit {proc.returncode})"
    assert sent_at is not None, f"{waited}; last output:\n{output[-4000:]}"
    assert sent_at < 4000, output  # the signal came during training
    assert proc.returncode == 0 and "sweep: 1 of 1 job(s) succeeded" in output, output
    [job] = (tmp_path / "requeued").glob("0_*")
    log = "".join(p.read_text() for p in (tmp_path / "requeued" / ".submitit").glob("*/*.out"))
    assert len(pids.read_text().split()) == 2, log  # the job ran twice: requeued once
    [stopped] = re.findall(r"stopped at step (\d+); checkpoint saved", log)
    assert int(stopped) >= sent_at and int(stopped) % 50 == 0, log
    assert f"submitit requeued the job; it resumes from step {stopped}" in log, log
    assert f"resumed from step {stopped} " in log, log  # not from the initialisation
    assert "Traceback" not in log, log
    assert json.loads((job / "status.json").read_text())["status"] == "ok"
    steps = logged_steps(job)
    assert steps == sorted(set(steps)), steps  # each step logged once
    through = sweep(tmp_path / "through", *LONG_TINY)  # in this process's launcher, unstopped
    assert through.returncode == 0, through.stdout + through.stderr
    [uninterrupted] = (tmp_path / "through").glob("0_*")
    assert (job / "eval.json").read_text() == (uninterrupted / "eval.json").read_text()
