"""What a new user met on a first run (issue 14, "Rough edges"), checked through the CLI.

The run name says what runs, train.log gets the per-step lines under a progress bar, JAX's
TPU notice is gone, steps/s counts training only, evaluate shows progress, and the persistent
compilation cache is filled by one run and used by the next.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from tests.cli import TINY, error_line, run_cli, run_in_process


@pytest.fixture(scope="module")
def reptile_run(tmp_path_factory):
    """``algorithm=reptile +debug=tiny`` with a bar, in a fresh directory, run directory default.

    Validation is made slow (400 tasks, one per call) so that counting it in steps/s shows.
    """
    cwd = tmp_path_factory.mktemp("cwd")
    result = run_cli(
        *TINY,
        "algorithm=reptile",
        "trainer.progress_bar=bar",
        "trainer.checkpoint_every=4",
        "eval.val_tasks=400",
        "eval.tasks_per_call=1",
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return cwd, result


def test_run_name_says_what_runs(reptile_run):
    cwd, _ = reptile_run
    (name,) = os.listdir(cwd / "outputs")
    assert name == "sinusoid_maml-algorithm=reptile-debug=tiny"
    (run_dir,) = (cwd / "outputs" / name).iterdir()
    assert f"training {name}: reptile on sinusoid" in (run_dir / "train.log").read_text()


def test_train_log_gets_the_step_lines_under_a_bar(reptile_run):
    cwd, result = reptile_run
    (run_dir,) = next((cwd / "outputs").iterdir()).iterdir()
    log = (run_dir / "train.log").read_text()
    assert "step 2/4 | mse" in log and "step 4/4 | mse" in log
    assert "step 2/4 | mse" not in result.stderr  # on the terminal the bar shows them
    assert "Unable to initialize backend" not in log + result.stderr


def test_steps_per_s_leaves_out_compiling_and_validation(reptile_run):
    cwd, _ = reptile_run
    (run_dir,) = next((cwd / "outputs").iterdir()).iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    summary = json.loads((run_dir / "summary.json").read_text())
    # Steps 1-2 ran in the call that compiled (2 steps per call): their time is compile time,
    # so that window has no rate, in metrics.jsonl or on its log line.
    assert [r["step"] for r in train] == [2, 4] and "steps_per_s" not in train[0], train
    assert "step 2/4 | mse" in (log := (run_dir / "train.log").read_text())
    assert next(line for line in log.splitlines() if "step 2/4 |" in line).endswith("| compiled")
    # The run's rate is over its timed seconds: the training loop's time less the compiling
    # call, the validations (400 tasks, one per call) and the saves inside it; the final
    # validation and evaluation come after the loop and count in neither. (It was computed with
    # the final validation subtracted too: 2e9 steps/s when the program came from the cache.)
    timed, untimed = summary["timed_seconds"], summary["train_seconds"] - summary["timed_seconds"]
    assert timed > 0 and untimed > summary["compile_seconds"], summary
    assert summary["steps_per_s"] == pytest.approx(2 / timed), summary  # steps 3-4, uncompiled
    assert train[1]["steps_per_s"] > 0, train


def test_evaluate_reports_progress(reptile_run):
    cwd, _ = reptile_run
    (run_dir,) = next((cwd / "outputs").iterdir()).iterdir()
    result = run_in_process(str(run_dir), "eval.num_tasks=6", module="metalearn.evaluate")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "evaluating on 6 test tasks" in result.stderr
    for shots in (5, 10, 20):
        assert f"test {shots} shots: 6 tasks in" in result.stderr
    assert "Unable to initialize backend" not in result.stderr


def test_evaluate_writes_a_relative_out_in_the_working_directory(
    reptile_run, tmp_path, monkeypatch
):
    cwd, _ = reptile_run
    (run_dir,) = next((cwd / "outputs").iterdir()).iterdir()
    monkeypatch.chdir(tmp_path)
    args = (str(run_dir), "--out", "mine.json", "eval.num_tasks=2")
    result = run_in_process(*args, module="metalearn.evaluate")
    assert result.returncode == 0, result.stderr[-4000:]
    records = json.loads((tmp_path / "mine.json").read_text())
    assert records and all(r["tasks"] == 2 and r["checkpoint"] == "best" for r in records)


def test_a_second_run_reuses_the_compilation_cache(tmp_path):
    from metalearn.runner.compilation_cache import MIN_COMPILE_TIME

    cache = tmp_path / "cache"
    common = [*TINY, f"trainer.compilation_cache={cache}"]
    # JAX logs each persistent-cache lookup (hit or miss) as a warning under these two flags,
    # into the run's log. Without the suite's own threshold: the runner's setting is checked.
    logged = {**os.environ, "JAX_LOG_COMPILES": "1", "JAX_EXPLAIN_CACHE_MISSES": "1"}
    logged.pop(MIN_COMPILE_TIME, None)
    first = run_cli(*common, f"hydra.run.dir={tmp_path / 'a'}", env=logged)
    assert first.returncode == 0, first.stderr[-4000:]
    entries = sorted(os.listdir(cache))
    programs = [name for name in entries if name.endswith("-cache")]
    first_log = (tmp_path / "a" / "train.log").read_text()
    assert "Persistent compilation cache hit" not in first_log  # it started empty
    # Every program the first run compiled is stored, however briefly it compiled (JAX's own
    # threshold, 1 s, stored none of a small run's programs).
    missed = set(
        re.findall(r"PERSISTENT COMPILATION CACHE MISS for '[^']*' with key '([^']*)'", first_log)
    )
    assert missed and missed == {name.removesuffix("-cache") for name in programs}, entries
    # The same job again, e.g. a rerun or a sweep job differing only in non-compiled settings.
    second = run_cli(*common, f"hydra.run.dir={tmp_path / 'b'}", env=logged)
    assert second.returncode == 0, second.stderr[-4000:]
    assert sorted(os.listdir(cache)) == entries  # nothing new was compiled and stored
    # Every program the first run stored was loaded by the second instead of compiled.
    hits = set(
        re.findall(
            r"Persistent compilation cache hit for '[^']*' with key '([^']*)'",
            (tmp_path / "b" / "train.log").read_text(),
        )
    )
    assert hits == {name.removesuffix("-cache") for name in programs}, (hits, programs)


def test_the_cache_stores_every_program_unless_the_environment_sets_a_threshold(
    tmp_path, monkeypatch
):
    import jax

    from metalearn.runner.compilation_cache import MIN_COMPILE_TIME, enable_compilation_cache

    key = "jax_persistent_cache_min_compile_time_secs"
    saved = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
    before = getattr(jax.config, key)
    try:
        jax.config.update(key, 1.0)  # JAX's default
        monkeypatch.delenv(MIN_COMPILE_TIME, raising=False)
        enable_compilation_cache(str(tmp_path))
        assert getattr(jax.config, key) == 0.0
        jax.config.update(key, 2.5)  # as JAX read it from the environment
        monkeypatch.setenv(MIN_COMPILE_TIME, "2.5")
        enable_compilation_cache(str(tmp_path))
        assert getattr(jax.config, key) == 2.5
    finally:
        jax.config.update(key, before)
        jax.config.update("jax_enable_compilation_cache", saved[0])
        jax.config.update("jax_compilation_cache_dir", saved[1])


def test_a_debug_preset_before_the_experiment_still_applies():
    # Hydra merges appended groups in command-line order: +debug=tiny written first was
    # overwritten by the experiment, and the full 70,000-step run ran in a "debug=tiny" directory.
    for order in (TINY, TINY[::-1]):
        result = run_in_process(*order, "--cfg", "job")
        assert result.returncode == 0, result.stderr[-2000:]
        job = yaml.safe_load(result.stdout)
        assert (job["trainer"]["meta_steps"], job["eval"]["num_tasks"]) == (4, 4), order


@pytest.mark.parametrize("setting, fragment", [("of", "give auto, off, or an absolute directory")])
def test_a_compilation_cache_that_is_no_usable_directory_is_one_line(tmp_path, setting, fragment):
    # "of" (a typo of off) made ./of/ wherever the command ran, silently; a file named there
    # turned the cache off with a warning nobody reads.
    afile = tmp_path / "afile"
    afile.write_text("x")
    for value, expected in [(setting, fragment), (str(afile), "cannot use it as a directory")]:
        result = run_cli(*TINY, f"trainer.compilation_cache={value}", cwd=tmp_path)
        error_line(result, f"trainer.compilation_cache={value}: ", expected)
    assert not (tmp_path / "of").exists()
