"""Runs vectorized in one compiled program (``hydra/launcher=vectorized``, ``train_runs``): each
run stays a run, equals itself trained alone, and survives faults as a run alone does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from metalearn.config import to_objects
from metalearn.runner.run import Runner
from metalearn.runner.rundir import RunDirectory
from metalearn.runner.steps import run_of
from tests.cli import RL_TINY, TINY, checkout_env, communicated, run_in_process, run_tool
from tests.conftest import compose_config, experiment_of, restore_latest_state
from tests.data.test_task_registry import IMAGE_SHAPES, fake_data_source
from tests.test_experiments import tiny_overrides

VECTORIZED = "hydra/launcher=vectorized"
# 200 steps in calls of 20, a checkpoint every 20: the equivalence of a group and its runs.
STEPS_200 = [
    "trainer.meta_steps=200",
    "trainer.steps_per_call=20",
    "trainer.log_every=100",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=100",
]


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit())


def relative_difference(a, b) -> float:
    """The largest difference of two pytrees' leaves, relative to the leaf's largest value."""
    return max(
        float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(y))), 1e-30))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("case", ["sinusoid", "omniglot", "maml-rl"])
def test_each_run_of_a_group_equals_the_same_run_alone_to_float32_rounding(tmp_path, case):
    # After 200 steps (MAML-RL: 20 meta-iterations) each run's parameters differ from the
    # same run's trained alone by no more than the run alone differs from itself started one
    # float32 ulp away: the group's batched products round otherwise, and training amplifies
    # a rounding as it amplifies any (Adam's first steps on near-zero gradients, MAML-RL's
    # rollouts and line search). The differences are printed.
    steps = 20 if case == "maml-rl" else 200
    overrides = {"sinusoid": TINY, "omniglot": omniglot_tiny(tmp_path), "maml-rl": RL_TINY}[case]
    rate = "algorithm.inner_lr=0.2" if case == "maml-rl" else "algorithm.inner_lr=0.05"
    settings = [["seed=0"], ["seed=1", rate], ["seed=2"]]
    with mocked_images(case):
        cfgs = [to_objects(compose_config([*overrides, *s])) for s in settings]
        exps = [experiment_of(c) for c in cfgs]
        dirs = [RunDirectory(str(tmp_path / f"group{i}"), c) for i, c in enumerate(cfgs)]
        group = Runner(exps, dirs)
        grouped = trained_for(group, group.initial_state, steps)
        by_group, by_ulp = [], []
        for i, (exp, cfg) in enumerate(zip(exps, cfgs, strict=True)):
            alone = Runner(exp, RunDirectory(str(tmp_path / f"alone{i}"), cfg))
            own = trained_for(alone, alone.initial_state, steps)
            start = alone.initial_state
            ulp = jax.tree.map(lambda p: np.nextafter(p, np.inf), start.meta_params)
            nudged = trained_for(alone, start._replace(meta_params=ulp), steps)
            by_group.append(relative_difference(run_of(grouped, i), own))
            by_ulp.append(relative_difference(nudged, own))
    print(f"{case}: group against alone {max(by_group):.3g}; one ulp alone {max(by_ulp):.3g}")
    assert max(by_group) <= 10 * max(by_ulp), (by_group, by_ulp)
    # and the runs do differ: the seeds and rates act
    assert relative_difference(run_of(grouped, 0), run_of(grouped, 1)) > 1e-3


def trained_for(runner: Runner, state, steps: int):
    """The meta-parameters after ``steps`` meta-steps from ``state`` (calls of up to 20)."""
    state = jax.tree.map(jnp.copy, state)  # the calls donate their state
    done = 0
    while done < steps:
        state, _ = runner.train_call(state, min(20, steps - done))
        done += min(20, steps - done)
    return state.meta_params


def omniglot_tiny(tmp_path: Path) -> list[str]:
    return tiny_overrides("omniglot_5w1s_cpu", str(tmp_path / "tfds"))


@contextlib.contextmanager
def mocked_images(case: str):
    """Omniglot's images from TFDS's mock data (as tests/test_experiments.py runs it)."""
    if case != "omniglot":
        yield
        return
    with tfds.testing.mock_data(as_data_source_fn=fake_data_source(IMAGE_SHAPES["omniglot"])):
        yield


def sweep(sweep_dir: Path, *overrides: str, launcher: str = VECTORIZED):
    """A sweep in this process (the kill tests below start the launcher as a process)."""
    return run_in_process("-m", *TINY, *overrides, launcher, f"hydra.sweep.dir={sweep_dir}")


def test_a_group_of_one_is_the_run_of_the_basic_launcher_bit_for_bit(tmp_path):
    vectorized = sweep(tmp_path / "v", "seed=3")
    basic = sweep(tmp_path / "b", "seed=3", launcher="hydra/launcher=basic")
    assert vectorized.returncode == basic.returncode == 0, vectorized.stderr[-2000:]
    (v,), (b,) = job_dirs(tmp_path / "v"), job_dirs(tmp_path / "b")
    assert (v / "eval.json").read_bytes() == (b / "eval.json").read_bytes()
    for x, y in zip(
        jax.tree.leaves(restore_latest_state(str(v))),
        jax.tree.leaves(restore_latest_state(str(b))),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)


def files_of(directory: Path) -> set[str]:
    """The files of a run directory, but for TensorBoard's (named by time and a random part)."""
    return {
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and "tfevents" not in p.name and "/d/" not in str(p)  # orbax's by hash
    }


def test_each_run_of_a_group_writes_what_it_writes_alone(tmp_path):
    vectorized = sweep(tmp_path / "v", "seed=0,1", "optimizer.lr=0.001,0.002")
    basic = sweep(
        tmp_path / "b", "seed=0,1", "optimizer.lr=0.001,0.002", launcher="hydra/launcher=basic"
    )
    assert vectorized.returncode == basic.returncode == 0, vectorized.stderr[-3000:]
    assert "program 1 of 1: 4 run(s)" in vectorized.stdout + vectorized.stderr
    v_jobs, b_jobs = job_dirs(tmp_path / "v"), job_dirs(tmp_path / "b")
    assert [p.name for p in v_jobs] == [p.name for p in b_jobs]
    for v, b in zip(v_jobs, b_jobs, strict=True):
        assert files_of(v) == files_of(b)
        assert (v / ".hydra" / "overrides.yaml").read_text() == (
            b / ".hydra" / "overrides.yaml"
        ).read_text()
        assert json.loads((v / "status.json").read_text())["status"] == "ok"
        assert json.loads((v / "summary.json").read_text())["runs_in_program"] == 4
    table = run_tool("collect_sweep", str(tmp_path / "v"))
    assert table.returncode == 0, table.stderr
    assert len([line for line in table.stdout.splitlines() if line[:1].isdigit()]) == 4 * 6
    evaluated = run_in_process(str(v_jobs[1]), "eval.num_tasks=2", module="metalearn.evaluate")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]


def test_jobs_that_differ_in_structure_run_as_separate_programs(tmp_path):
    result = sweep(
        tmp_path / "s",
        "model.hidden_sizes=[8],[16]",
        "seed=0,1,2",
        "hydra.launcher.max_runs_per_program=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    # two structures of three runs, each split by the bound into programs of 2 and 1
    assert "program 4 of 4" in output and "program 5" not in output
    assert output.count(": 2 run(s)") == 2 and output.count(": 1 run(s)") == 2
    assert "sweep: 6 of 6 job(s) succeeded" in output


def test_a_run_that_diverges_fails_alone_and_the_others_go_on(tmp_path):
    result = sweep(tmp_path / "s", "optimizer.lr=0.001,1e30", "seed=0")
    assert result.returncode == 1, result.stderr[-3000:]
    good, bad = job_dirs(tmp_path / "s")
    assert json.loads((good / "status.json").read_text())["status"] == "ok"
    status = json.loads((bad / "status.json").read_text())
    assert status["status"] == "failed" and status["message"].startswith("error: non-finite")
    assert "Likely cause" in status["message"] and "Traceback" not in result.stderr
    assert (good / "eval.json").exists() and not (bad / "eval.json").exists()
    assert "sweep: 1 of 2 job(s) succeeded" in result.stderr


def test_a_rerun_trains_only_the_runs_not_finished_and_refusals_hold_per_run(tmp_path):
    sweep_dir = tmp_path / "s"
    first = sweep(sweep_dir, "seed=0,1")
    assert first.returncode == 0, first.stderr[-2000:]
    before = {p.name: (p / "eval.json").stat().st_mtime_ns for p in job_dirs(sweep_dir)}
    # A third seed joins; job 1's directory now holds a run of another config (refused).
    other = sweep_dir / "1_seed=1"
    record = other / "checkpoints" / "config.json"
    saved = json.loads(record.read_text())
    saved["config"]["trainer.meta_batch_size"] = 3
    record.write_text(json.dumps(saved))
    again = sweep(sweep_dir, "seed=0,1,2")
    assert again.returncode == 1, again.stderr[-3000:]
    # one program for the three, in which only seed 2 trains: seed 0's run is finished (its
    # evaluation is not even rewritten), seed 1's directory refuses its job
    assert "program 1 of 1: 3 run(s)" in again.stdout + again.stderr
    assert (sweep_dir / "0_seed=0" / "eval.json").stat().st_mtime_ns == before["0_seed=0"]
    assert (sweep_dir / "1_seed=1" / "eval.json").stat().st_mtime_ns == before["1_seed=1"]
    refused = json.loads((other / "status.json").read_text())
    assert refused["status"] == "refused" and refused["previous"]["status"] == "ok"
    assert json.loads((sweep_dir / "2_seed=2" / "status.json").read_text())["status"] == "ok"
    assert "sweep: 2 of 3 job(s) succeeded" in again.stderr


def test_a_job_choosing_a_schema_entry_is_refused_and_the_others_train(tmp_path):
    # The message lists a group's options, read from Hydra only when a job is refused.
    result = run_in_process(
        "-m", *TINY, "algorithm=maml,maml_schema", VECTORIZED, f"hydra.sweep.dir={tmp_path}"
    )
    assert result.returncode == 1, result.stderr[-3000:]
    status = json.loads((tmp_path / "1_algorithm=maml_schema" / "status.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] == 2, status
    head, options = status["message"].split("use one of: ")
    assert head == "error: algorithm=maml_schema is an internal schema entry, not an option; "
    assert "maml" in options.split(", ") and "_schema" not in options
    assert json.loads((tmp_path / "0_algorithm=maml" / "status.json").read_text())["status"] == "ok"


# 400 steps, a checkpoint and a validation every 20 (the tiny preset validates every 2 steps:
# 200 validations would be most of the sweep's time).
LONG = ["trainer.meta_steps=400", "trainer.checkpoint_every=20", "trainer.log_every=20"]
LONG += ["trainer.eval_every=20"]


def start_sweep(sweep_dir: Path) -> subprocess.Popen:
    args = ["-m", *TINY, *LONG, "seed=0,1,2", VECTORIZED, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.Popen(
        [sys.executable, "-m", "metalearn.train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=checkout_env(),
    )


def wait_for_checkpoints(sweep_dir: Path, count: int, timeout: float = 240) -> None:
    """Until every job has ``count`` checkpoints or more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = job_dirs(sweep_dir) if sweep_dir.exists() else []
        steps = [
            [n for n in os.listdir(j / "checkpoints") if n.isdigit()]
            if (j / "checkpoints").exists()
            else []
            for j in jobs
        ]
        if len(jobs) == 3 and all(len(s) >= count for s in steps):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {count} checkpoints in every job of {sweep_dir} in {timeout} s")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, bytes]:
    sweep_dir = tmp_path_factory.mktemp("straight") / "s"
    process = start_sweep(sweep_dir)
    output, _ = communicated(process, 600)
    assert process.returncode == 0, output[-3000:]
    return {p.name: (p / "eval.json").read_bytes() for p in job_dirs(sweep_dir)}


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_killed_group_resumes_every_run_as_if_uninterrupted(tmp_path, uninterrupted, kill):
    sweep_dir = tmp_path / "s"
    process = start_sweep(sweep_dir)
    wait_for_checkpoints(sweep_dir, 2)
    process.send_signal(kill)
    output, _ = communicated(process, 300)
    assert "Traceback" not in output, output[-3000:]
    if kill == signal.SIGTERM:  # every run saved the step it stopped at: the same one
        assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
        jobs = job_dirs(sweep_dir)
        newest = {max(int(n) for n in os.listdir(j / "checkpoints") if n.isdigit()) for j in jobs}
        assert len(newest) == 1, newest
        statuses = {json.loads((j / "status.json").read_text())["status"] for j in jobs}
        assert statuses == {"interrupted"}
    resumed = start_sweep(sweep_dir)
    output, _ = communicated(resumed, 600)
    assert resumed.returncode == 0, output[-3000:]
    assert "resumed from step" in output
    for job in job_dirs(sweep_dir):
        assert (job / "eval.json").read_bytes() == uninterrupted[job.name], job.name


def test_a_group_too_large_for_the_device_says_how_many_runs_fit(tmp_path, monkeypatch):
    # On a GPU the device's memory bounds a group (XLA's estimate of the program's); here the
    # limit is set small, as a GPU's would be for a group of thousands of runs.
    import metalearn.runner.run as run_module
    from metalearn.runner.layout import saved_steps
    from metalearn.runner.loop import Job, train_runs

    cfgs = [to_objects(compose_config([*TINY, f"seed={s}"])) for s in range(3)]
    monkeypatch.setattr(run_module, "device_memory_limit", lambda: 1024)  # bytes
    with pytest.raises(ValueError) as refused:  # the group's program: every run of it
        train_runs([Job(c, str(tmp_path / str(i))) for i, c in enumerate(cfgs)])
    message = str(refused.value)
    assert message.startswith("a program of 3 runs needs ") and "the device has 1.0 KiB" in message
    assert message.endswith("about 1 run(s) fit; set hydra.launcher.max_runs_per_program=1")
    assert not any(saved_steps(str(tmp_path / str(i))) for i in range(3))  # nothing trained
