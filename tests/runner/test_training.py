"""End-to-end runs: outputs, resume equals an uninterrupted run, signals, NaNs, sweeps."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf

from metalearn.config import to_objects
from metalearn.runner.checkpoints import CheckpointStore
from metalearn.runner.loop import (
    NonFiniteError,
    chunk_length,
    train_and_evaluate,
)
from metalearn.runner.reporting import PROCESS_KEYS
from metalearn.runner.rundir import saved_steps
from metalearn.runner.steps import trained
from tests.cli import Watched, checkout_env, communicated, run_cli, run_in_process, run_tool
from tests.conftest import (
    compose_config,
    copy_of,
    experiment_of,
    restore_latest_state,
    runner_of,
)

TINY = ["+experiment=sinusoid_maml", "+debug=tiny"]


def tiny_config(*overrides):
    return to_objects(compose_config([*TINY, *overrides]))


def test_tiny_run_writes_every_output(finished_tiny_run):
    tmp_path, summary = finished_tiny_run.path, finished_tiny_run.summary
    assert not summary["interrupted"] and summary["step"] == 4
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["split"] == "train"] == [2, 4]
    assert all(np.isfinite(line["train/mse"]) for line in lines if line["split"] == "train")
    records = json.loads((tmp_path / "eval.json").read_text())
    assert {(r["shots"], r["steps"]) for r in records} == {
        (s, k) for s in (5, 10, 20) for k in (0, 1)
    }
    for r in records:
        paired = {"change", "change_ci95"} if r["steps"] else set()  # after k > 0 steps
        assert set(r) == {
            "metric",
            "shots",
            "steps",
            "mean",
            "ci95",
            "median",
            "median_ci95",
            "tasks",
            "nonfinite",
            "diverged",
            *paired,
        }
        assert r["metric"] == "mse" and r["tasks"] == 4
    assert os.listdir(tmp_path / "tensorboard")
    assert CheckpointStore(str(tmp_path / "checkpoints"), 2).latest_step() == 4


def test_chunks_never_cross_a_boundary():
    cfg = tiny_config(
        "trainer.meta_steps=23",
        "trainer.steps_per_call=4",
        "trainer.log_every=5",
        "trainer.eval_every=0",
        "trainer.checkpoint_every=10",
    )
    step, ends = 0, []
    while step < 23:
        step += chunk_length(step, cfg, cfg.trainer.steps_per_call)
        ends.append(step)
    assert ends == [4, 5, 9, 10, 14, 15, 19, 20, 23]


def test_resumed_run_reaches_the_same_parameters(tmp_path):
    overrides = ["trainer.meta_steps=12", "trainer.checkpoint_every=4", "trainer.eval_every=0"]
    cfg = tiny_config(*overrides, "trainer.allow_changes=[trainer.meta_steps]")
    assert train_and_evaluate(cfg, str(tmp_path / "straight"))["start_step"] == 0
    # Interrupted after 8 steps (a shorter run), then resumed with the full config.
    short = tiny_config(*overrides[1:], "trainer.meta_steps=8")
    train_and_evaluate(short, str(tmp_path / "resumed"))
    assert CheckpointStore(str(tmp_path / "resumed" / "checkpoints"), 2).latest_step() == 8
    first = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    summary = train_and_evaluate(cfg, str(tmp_path / "resumed"))
    assert summary["start_step"] == 8  # the resumed process's own times, said so
    # and the first process's are kept (they were overwritten)
    assert summary["earlier_processes"] == [{key: first[key] for key in PROCESS_KEYS}]
    assert first["earlier_processes"] == [] and first["step"] == 8
    straight, resumed = (
        restore_latest_state(str(tmp_path / "straight"), cfg),
        restore_latest_state(str(tmp_path / "resumed"), cfg),
    )
    assert int(straight.step) == int(resumed.step) == 12
    for a, b in zip(
        jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    lines = [
        json.loads(x) for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    ]
    keys = [(line["step"], line["split"]) for line in lines]
    assert len(keys) == len(set(keys))  # nothing logged twice across the interruption
    assert [k for k in keys if k[1] == "train"] == [(s, "train") for s in range(2, 13, 2)]


def start_training(overrides: list[str]) -> subprocess.Popen:
    """``python -m metalearn.train overrides...`` in the background, output on one pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "metalearn.train", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=checkout_env(),
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_usable_checkpoint_and_resume_matches(tmp_path, signum):
    run_dir = tmp_path / "run"
    overrides = [
        *TINY,
        "trainer.meta_steps=100000",
        "trainer.steps_per_call=10",
        "trainer.log_every=10",
        "trainer.checkpoint_every=50000",
        "trainer.eval_every=0",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start_training(overrides)
    watched, metrics = Watched(proc), run_dir / "metrics.jsonl"
    watched.wait_until(  # the first training record: the run is in its training loop
        "the first record in metrics.jsonl",
        lambda: metrics.exists() and bool(metrics.read_text().strip()),
    )
    proc.send_signal(signum)
    output = watched.exit(f"{signal.Signals(signum).name} sent during training")
    assert proc.returncode == 128 + signum, output
    assert "Traceback" not in output
    assert f"received {signal.Signals(signum).name}" in output
    store = CheckpointStore(str(run_dir / "checkpoints"), 2)
    stopped_at = store.latest_step()
    assert stopped_at is not None and 0 < stopped_at < 100000 and stopped_at % 10 == 0
    cfg = to_objects(OmegaConf.load(run_dir / "config.yaml"))
    state, _ = store.restore(experiment_of(cfg).initial_state)
    assert int(state.step) == stopped_at
    # Finishing a few steps later from that checkpoint equals a straight run of the same length.
    target = stopped_at + 20
    finish = tiny_config(
        "trainer.meta_steps=" + str(target),
        "trainer.steps_per_call=10",
        "trainer.log_every=10",
        "trainer.checkpoint_every=50000",
        "trainer.eval_every=0",
        "trainer.allow_changes=[trainer.meta_steps]",
    )
    train_and_evaluate(finish, str(run_dir))
    train_and_evaluate(finish, str(tmp_path / "straight"))
    a, b = (
        restore_latest_state(str(run_dir), finish),
        restore_latest_state(str(tmp_path / "straight"), finish),
    )
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def train_records(run_dir) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["train/mse"]) for r in records if r["split"] == "train"]


def test_a_resumed_run_logs_the_averages_of_an_uninterrupted_one(tmp_path):
    # The steps between the last log line and a stop were left out of the next average: stopped
    # at step 8900 and resumed, the record of step 9000 averaged steps 8901-9000 only (train/mse
    # 0.5550 against 0.5694 uninterrupted). Here one log line, at the end, spans the stop.
    run_dir = tmp_path / "run"
    common = [
        "trainer.steps_per_call=10",
        "trainer.log_every=100000",
        "trainer.checkpoint_every=100000",
        "trainer.eval_every=0",
    ]
    overrides = [*TINY, "trainer.meta_steps=100000", *common, f"hydra.run.dir={run_dir}"]
    proc = start_training(overrides)
    lines = []
    for line in proc.stdout:  # the first compiled call (inside the training loop); then a moment
        lines.append(line)
        if "compiled 10 fused meta-step(s)" in line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    output = "".join(lines) + communicated(proc, 120)[0]
    assert proc.returncode == 130, output
    stopped_at = CheckpointStore(str(run_dir / "checkpoints"), 2).latest_step()
    assert stopped_at is not None and 0 < stopped_at < 100000, output
    assert not (run_dir / "metrics.jsonl").read_text().strip()  # nothing logged before the stop
    target = stopped_at + 20
    finish = tiny_config(
        f"trainer.meta_steps={target}", *common, "trainer.allow_changes=[trainer.meta_steps]"
    )
    train_and_evaluate(finish, str(run_dir))
    train_and_evaluate(finish, str(tmp_path / "straight"))
    [(step, resumed)] = train_records(run_dir)
    [(_, straight)] = train_records(tmp_path / "straight")
    assert step == target
    np.testing.assert_allclose(resumed, straight, rtol=1e-6)


def test_half_written_checkpoint_is_never_loaded(finished_tiny_run, tmp_path):
    cfg = tiny_config()
    tmp_path = copy_of(finished_tiny_run, tmp_path / "run")
    # What a process killed mid-save leaves behind: orbax's temporary directory.
    (tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1234").mkdir()
    (tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1234" / "garbage").write_text("x")
    assert CheckpointStore(str(tmp_path / "checkpoints"), 2).latest_step() == 4
    state = restore_latest_state(str(tmp_path), cfg)
    assert int(state.step) == 4


def test_nan_stops_with_a_clear_error_and_saves_nothing_non_finite(tmp_path):
    cfg = tiny_config("optimizer.lr=1e30", "trainer.meta_steps=8")
    with pytest.raises(NonFiniteError, match="non-finite .* at step") as err:
        train_and_evaluate(cfg, str(tmp_path))
    assert "optimizer.lr" in str(err.value)
    store = CheckpointStore(str(tmp_path / "checkpoints"), 2)
    if store.latest_step() is not None:
        state, _ = store.restore(experiment_of(cfg).initial_state)
        assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(state.meta_params))


def test_multirun_sweep_and_gather(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *TINY,
        "algorithm.inner_lr=0.003,0.01",
        "seed=0,1",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(runs) == 4 and all((p / "eval.json").exists() for p in runs)
    table = run_tool("collect_sweep", str(sweep_dir), "--csv", str(tmp_path / "t.csv"))
    assert table.returncode == 0, table.stderr
    assert "algorithm.inner_lr" in table.stdout and "seed" in table.stdout
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 * 6  # header, then 4 runs x 3 shots x 2 step counts
    header = rows[0].split(",")
    assert {"median", "diverged"} <= set(header) and "median_ci95" not in header


def test_no_host_to_device_copy_per_meta_step(tmp_path):
    runner = runner_of(tiny_config(), tmp_path)
    state = runner.initial_state
    state, _ = runner.train_call(state, 2)  # compile outside the guard
    with jax.transfer_guard_host_to_device("disallow"):
        for _ in range(3):
            state, metrics = runner.train_call(state, 2)
    jax.block_until_ready(state)
    assert int(state.step) == 8
    runner.close()


def test_saved_checkpoint_is_evaluated_on_its_own(finished_tiny_run, tmp_path):
    tmp_path = copy_of(finished_tiny_run, tmp_path / "run")
    result = run_cli(
        str(tmp_path),
        "--which",
        "latest",
        "eval.num_tasks=6",
        module="metalearn.evaluate",
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    records = json.loads((tmp_path / "eval_latest.json").read_text())
    assert {r["tasks"] for r in records} == {6} and len(records) == 3 * 2
    missing = run_in_process(str(tmp_path / "nope"), module="metalearn.evaluate")
    assert missing.returncode != 0 and "not found" in missing.stderr


def test_load_for_evaluation_gives_the_untrained_initialisation_as_init(
    finished_tiny_run, tmp_path
):
    cfg, run = tiny_config(), finished_tiny_run.path
    runner = runner_of(cfg, run)
    init = runner.load("init")
    assert (runner.loaded, runner.loaded_step) == ("init", 0)
    runner.close()
    fresh = runner_of(cfg, tmp_path / "fresh")  # an empty directory: its own initial draw
    expected = trained(fresh.initial_state)
    fresh.close()
    for got, want in zip(jax.tree.leaves(init), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    runner = runner_of(cfg, run)
    latest = runner.load("latest")
    runner.close()
    assert runner.loaded == "latest" and runner.loaded_step > 0
    pairs = zip(jax.tree.leaves(init.meta_params), jax.tree.leaves(latest.meta_params), strict=True)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)


def test_training_and_evaluation_queue_only_a_few_calls_ahead(tmp_path, monkeypatch):
    """Every train and evaluation call goes through a bounded queue (devices.InFlight): with
    nothing read for many steps, JAX would otherwise queue every call, which with several
    XLA:CPU devices deadlocked the client's launch threads (XLA then aborts the process)."""
    from metalearn.runner import devices, evaluation, loop

    queues = []

    class Recording(devices.InFlight):
        def __init__(self, limit=devices.MAX_CALLS_IN_FLIGHT):
            super().__init__(limit)
            self.added, self.longest = 0, 0
            queues.append(self)

        def add(self, outputs):
            super().add(outputs)
            self.added += 1
            self.longest = max(self.longest, len(self.calls))

    monkeypatch.setattr(loop, "InFlight", Recording)
    monkeypatch.setattr(evaluation, "InFlight", Recording)
    cfg = tiny_config(
        "trainer.meta_steps=24",
        "trainer.steps_per_call=1",
        "trainer.log_every=24",
        "trainer.eval_every=0",
        "trainer.checkpoint_every=24",
        "eval.num_tasks=16",
    )
    train_and_evaluate(cfg, str(tmp_path))
    train, *evaluations = queues
    assert train.added == 24 and train.longest == devices.MAX_CALLS_IN_FLIGHT
    assert evaluations and all(q.longest <= devices.MAX_CALLS_IN_FLIGHT for q in evaluations)
    assert sum(q.added for q in evaluations) >= 16 // 2  # tasks_per_call 2


def test_a_validation_with_every_task_non_finite_does_not_stop_the_run(tmp_path):
    # 30 inner steps of 5.0 blow up every task (training uses 1 step, which stays finite); the
    # validation's mean is then None, which the TensorBoard writer refused with a traceback
    # at the first validation, before any checkpoint was saved.
    run_dir = tmp_path / "run"
    result = run_cli(
        *TINY, "algorithm.inner_lr=5", "eval.steps=[0,1,30]", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert saved_steps(str(run_dir)) == [2, 4]
    blown = [r for r in json.loads((run_dir / "eval.json").read_text()) if r["steps"] == 30]
    assert blown and all(r["mean"] is None and r["nonfinite"] == r["tasks"] for r in blown)
    assert "all 4 tasks non-finite" in result.stdout  # the log line of the test records
