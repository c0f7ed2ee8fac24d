"""Bad input through the CLI ends in one ``error:`` line saying what to do, exit status 2.

Each case here ended in a raw traceback, a misleading message or a late failure before
(issue 14, "Raw tracebacks that must become one clear line"); docs/reliability.md lists them.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil

import pytest
from omegaconf import OmegaConf

from metalearn.data.fewshot_builder import load_split_arrays
from metalearn.data.omniglot_builder import OmniglotVinyals
from metalearn.runner.rundir import saved_steps
from metalearn.runner.saved_run import load_run_config
from tests.cli import OMNIGLOT_TINY, RL_TINY, TINY, error_line, run_cli, run_in_process
from tests.conftest import compose_config
from tests.data.fake_sources import truncate, write_omniglot

ZIPS = ("images_background.zip", "images_evaluation.zip")


@pytest.fixture(scope="module")
def fake_omniglot(tmp_path_factory):
    """Generated Omniglot archives (3 drawings per character) and a TFDS dir prepared from them."""
    manual = tmp_path_factory.mktemp("omniglot_manual")
    write_omniglot(str(manual))
    data_dir = tmp_path_factory.mktemp("tfds")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        load_split_arrays(OmniglotVinyals, data_dir=str(data_dir), manual_dir=str(manual))
    return manual, data_dir, printed.getvalue()


def test_preparing_from_a_manual_directory_announces_no_download(fake_omniglot):
    # Nothing is downloaded from a manual directory: TFDS's "Downloading ... Unknown size" is gone.
    assert "Unknown size" not in fake_omniglot[2]


def damage(path: str, how: str) -> None:
    if how == "missing":
        os.remove(path)
    elif how == "empty":
        open(path, "wb").close()
    elif how == "truncated":
        truncate(path, 0.5)
    else:  # random bytes of the same size
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(os.urandom(size))


@pytest.mark.parametrize("how", ["missing", "empty", "truncated", "random"])
def test_damaged_omniglot_zip_is_one_line(fake_omniglot, tmp_path, how):
    manual = tmp_path / "manual"
    shutil.copytree(fake_omniglot[0], manual)
    damage(str(manual / ZIPS[1]), how)
    result = run_in_process(
        *OMNIGLOT_TINY,
        f"data.manual_dir={manual}",
        f"data.data_dir={tmp_path / 'tfds'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    expected = "not found" if how == "missing" else "truncated or corrupt"
    error_line(result, "omniglot_vinyals", str(manual / ZIPS[1]), expected, "download")


def test_corrupt_prepared_dataset_names_the_directory_to_delete(fake_omniglot, tmp_path):
    data_dir = tmp_path / "tfds"
    shutil.copytree(fake_omniglot[1], data_dir)
    version_dir = data_dir / "omniglot_vinyals" / "1.0.0"
    (shard,) = version_dir.glob("omniglot_vinyals-train.array_record-*")
    data = bytearray(shard.read_bytes())
    data[100:200] = bytes(b ^ 0xFF for b in data[100:200])
    shard.write_bytes(bytes(data))
    result = run_in_process(
        *OMNIGLOT_TINY, f"data.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'r'}"
    )
    error_line(result, f"prepared dataset in {version_dir} is corrupt", "delete that directory")


def test_eval_shots_the_data_cannot_supply_fail_before_training(fake_omniglot, tmp_path):
    run_dir = tmp_path / "run"
    result = run_in_process(
        *OMNIGLOT_TINY,
        f"data.data_dir={fake_omniglot[1]}",
        "data.ways=2",
        "data.num_queries=1",
        "trainer.shots=1",
        "eval.shots=[1,5]",
        f"hydra.run.dir={run_dir}",
    )
    error_line(result, "eval.shots=[1, 5]", "shots=5 + data.num_queries=1 exceeds the 3", "lower")
    # Refused before any training step: no checkpoint and no metrics (checkpoints/ holds only the
    # run's config record, written when the run directory is claimed).
    assert saved_steps(str(run_dir)) == [] and not (run_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**64)])
def test_seed_outside_the_key_range(tmp_path, seed):
    result = run_in_process(*TINY, f"seed={seed}", f"hydra.run.dir={tmp_path}")
    error_line(result, "seed must be an integer in [0, 2**32 - 1]", f"got {seed}")


def test_conv4_on_sinusoid_says_the_model_needs_images(tmp_path):
    result = run_in_process(*TINY, "model=conv4", f"hydra.run.dir={tmp_path}")
    error_line(result, "model=conv4 needs images", "data=sinusoid", "model=mlp")


def test_conv4_on_an_rl_task_family_names_the_policy_model(tmp_path):
    # It advised model=mlp, which the RL task family then refused: use model=gaussian_mlp.
    result = run_in_process(
        "+experiment=rl_nav2d_maml", "+debug=tiny", "model=conv4", f"hydra.run.dir={tmp_path}"
    )
    line = error_line(result, "model=conv4 needs images", "model=gaussian_mlp")
    assert "model=mlp" not in line and "image dataset" not in line


def test_distributed_without_a_coordinator_names_the_keys(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    result = run_cli(*TINY, "distributed.enabled=true", f"hydra.run.dir={tmp_path}", env=env)
    error_line(
        result,
        "distributed.coordinator_address",
        "distributed.num_processes",
        "distributed.process_id",
        "no SLURM environment found",
    )


def test_schema_entries_are_not_group_options(tmp_path):
    result = run_in_process(*TINY, "algorithm=maml_schema", f"hydra.run.dir={tmp_path}")
    line = error_line(result, "algorithm=maml_schema is an internal schema entry", "maml")
    assert "maml_schema" not in line.split("use one of:")[1]


def test_help_lists_only_the_options_a_command_line_may_select():
    # Hydra's --help listed every NAME_schema entry (refused when chosen) and base_* experiment.
    result = run_in_process("+experiment=sinusoid_maml", "--help")
    assert result.returncode == 0, result.stderr
    groups = result.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert "algorithm: anil, baseline, baseline_pp, boil, cavia, fomaml," in groups
    assert "experiment: cifarfs_5w1s," in groups
    assert "_schema" not in groups and "base_" not in groups
    assert "inner_lr:" in result.stdout.split("== Config ==")[1]  # the composed config stays


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["eval.num_task=5"], ["eval.num_task is not a setting of eval", "eval.num_tasks?"]),
        # Hydra accepts a key appended with +; nothing would read it, so it is refused too.
        (["+eval.num_task=5"], ["eval.num_task is not a setting of eval", "eval.num_tasks?"]),
        (["+algorithm.inner_lrr=0.1"], ["algorithm.inner_lrr", "did you mean algorithm.inner_lr?"]),
        (["evl.num_tasks=5"], ["evl is not a setting of the config", "did you mean eval?"]),
        (["optimizer.lr=fast"], ["optimizer.lr=fast", "could not be converted to Float"]),
        (["algorithm=mamll"], ["algorithm=mamll is not an option", "use one of: anil, "]),
        (["seed=0,1"], ["Ambiguous value", "--multirun"]),
        (["seed=[1,2"], ["cannot parse the override 'seed=[1,2'"]),
        # A run directory named after an override: the hint says how to quote it.
        (["hydra.run.dir=runs/a=b"], ["needs quotes: 'hydra.run.dir=\"runs/a=b\"'"]),
        (["-m", "optimizer.lr=0.001,fast"], ["optimizer.lr=fast", "converted to Float"]),
        (["--foo"], ["unrecognized arguments: --foo", "usage: python -m metalearn.train"]),
    ],
)
def test_a_command_line_hydra_cannot_compose_is_one_line(tmp_path, overrides, fragments):
    run_dirs = [f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    # "-m" lands between overrides here, which argparse alone refuses (train moves it first).
    result = run_in_process(*TINY, *overrides, *run_dirs)
    line = error_line(result, *fragments)
    assert "_schema" not in line and "+eval" not in line  # no internal entries, no bad advice
    # Refused before the run starts: no config.yaml, no sweep job.
    assert not (tmp_path / "run" / "config.yaml").exists()
    assert not (tmp_path / "sweep" / "0").exists()


def test_an_unknown_experiment_or_rl_key_is_one_line(tmp_path):
    result = run_in_process("+experiment=sinusoid_mam", f"hydra.run.dir={tmp_path}")
    line = error_line(result, "sinusoid_mam is not an option (did you mean sinusoid_maml?)")
    assert "sinusoid_maml, " in line and "base_" not in line  # base_*: shared parts, not runs
    result = run_in_process(*RL_TINY, "model.hidden=[4]", f"hydra.run.dir={tmp_path}")
    error_line(result, "model.hidden is not a setting of model (GaussianMLPConfig", "hidden_sizes?")


def test_hydra_full_error_still_gives_hydras_traceback(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    result = run_in_process(*TINY, "eval.num_task=5", f"hydra.run.dir={tmp_path}", env=env)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "ConfigCompositionException" in result.stderr


@pytest.mark.parametrize(
    "overrides, blamed, cleared",
    [
        (
            ["algorithm.inner_lr=1e4", "algorithm.inner_steps=5"],
            "algorithm.inner_lr",
            "optimizer.lr",
        ),
        (["optimizer.lr=1e30", "trainer.meta_steps=8"], "optimizer.lr", "algorithm.inner_lr"),
    ],
)
def test_nan_names_the_rate_that_diverged(tmp_path, overrides, blamed, cleared):
    result = run_in_process(*TINY, *overrides, f"hydra.run.dir={tmp_path}")
    line = error_line(result, "non-finite", f"lower {blamed}")
    assert f"lower {cleared}" not in line


@pytest.fixture(scope="module")
def run_config_dir(tmp_path_factory):
    """A run directory holding only a config.yaml, as metalearn.train writes it."""
    directory = tmp_path_factory.mktemp("run")
    OmegaConf.save(compose_config(TINY), directory / "config.yaml", resolve=True)
    return directory


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("eval.num_task=5", ["eval.num_task is not a setting", "did you mean eval.num_tasks?"]),
        ("evl.num_tasks=5", ["evl is not a setting", "did you mean eval?"]),
        ("algorithm.inner_lrr=0.1", ["algorithm.inner_lrr", "did you mean algorithm.inner_lr?"]),
        ("optimizer.lr=fast", ["optimizer.lr", "fast", "check the overrides"]),
        # It said "algorithm config has no 'name'".
        (
            "algorithm=reptile",
            ["evaluated with the algorithm it was trained with (algorithm=maml)"],
        ),
        # It said "+eval is not a setting of the config".
        ("+eval.foo=1", ["eval.foo is not a setting of eval (EvalConfig: "]),
        ("eval.shots=1,5", ["'eval.shots=1,5'", "a list is written [a,b]"]),
        ("~eval.shots=1", ["'~eval.shots=1'", "no ~ deletion"]),
    ],
)
def test_evaluate_with_a_misspelt_key(run_config_dir, override, fragments):
    result = run_in_process(str(run_config_dir), override, module="metalearn.evaluate")
    line = error_line(result, *fragments)
    assert "+eval is" not in line


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("seed=3", ["seed is read in training only", "drawn from eval.seed"]),
        (
            "algorithm.inner_steps=5",
            ["algorithm.inner_steps is read in training only", "eval.steps"],
        ),
        ("eval.select_best=false", ["eval.select_best is read in training only", "--which"]),
        ("optimizer.lr=0.1", ["optimizer.lr is read in training only"]),
        ("+trainer.meta_steps=10", ["trainer.meta_steps is read in training only"]),
    ],
)
# Evaluated as without it, and recorded in the evaluation's overrides as if it had counted.
def test_evaluate_refuses_a_training_setting(run_config_dir, override, fragments):
    result = run_in_process(str(run_config_dir), override, module="metalearn.evaluate")
    error_line(
        result, f"{override} cannot change an evaluation", *fragments, "nothing was evaluated"
    )


@pytest.mark.parametrize("override", ["eval.steps=[0,1", "eval.num_tasks={"])
def test_evaluate_with_an_override_that_does_not_parse(run_config_dir, override):
    # A 50-line yaml.parser.ParserError traceback; now the line metalearn.train prints.
    result = run_in_process(str(run_config_dir), override, module="metalearn.evaluate")
    error_line(result, f"cannot parse the override {override!r}", "override_grammar")


def test_evaluate_overrides_are_read_as_train_reads_them(run_config_dir):
    # "+eval.num_tasks=5" was read as a key named "+eval".
    cfg = load_run_config(str(run_config_dir), ["+eval.num_tasks=5", "eval.steps=[0, 2]"])
    assert (cfg.eval.num_tasks, list(cfg.eval.steps)) == (5, [0, 2])


@pytest.mark.parametrize(
    "key, value, problem",
    [
        # A TypeError traceback, exit 1.
        ("algorithm", 5, "algorithm: 5 is not a section of settings"),
        # Three lines of OmegaConf internals ("Invalid input. Supports one of [dict,...").
        ("trainer", 5, "trainer: 5 is not a section of settings"),
        # "error: invalid literal for int() with base 10: 'abc'".
        ("seed", "abc", "seed: 'abc' is not an integer"),
        # "... could not be converted to Integer: check the overrides (none) against ...".
        ("trainer.meta_steps", "abc", "trainer.meta_steps: Value 'abc' of type 'str' could not"),
    ],
)
def test_evaluate_with_a_corrupt_config(run_config_dir, tmp_path, key, value, problem):
    saved = OmegaConf.load(run_config_dir / "config.yaml")
    OmegaConf.update(saved, key, value, merge=False)
    OmegaConf.save(saved, tmp_path / "config.yaml")
    result = run_in_process(str(tmp_path), module="metalearn.evaluate")
    line = error_line(result, str(tmp_path / "config.yaml"), problem, "restore it from a copy")
    assert "check the overrides" not in line


@pytest.mark.parametrize("cut", [0.0, 0.5])
def test_evaluate_with_an_empty_or_half_written_config(run_config_dir, tmp_path, cut):
    text = (run_config_dir / "config.yaml").read_text()
    # Cut at a line's end, the rest still parses (a cut inside a line: the test below).
    (tmp_path / "config.yaml").write_text(text[: text.rfind("\n", 0, int(len(text) * cut)) + 1])
    result = run_in_process(str(tmp_path), module="metalearn.evaluate")
    error_line(result, str(tmp_path / "config.yaml"), "empty or half-written", "recreate it")


def test_evaluate_with_a_config_cut_inside_a_line(run_config_dir, tmp_path):
    text = (run_config_dir / "config.yaml").read_text()
    cut = text.index(":", len(text) // 2) - 2  # inside a key: YAML cannot parse the last line
    (tmp_path / "config.yaml").write_text(text[:cut])
    result = run_in_process(str(tmp_path), module="metalearn.evaluate")
    error_line(result, f"{tmp_path / 'config.yaml'} cannot be read (", "recreate it")


def test_evaluate_on_a_sweep_directory_names_its_jobs(run_config_dir, tmp_path):
    # It said "config.yaml not found: is DIR a metalearn run directory?" (it is, in a way).
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    (tmp_path / "3_unfinished").mkdir()
    for job in ("10_seed=10", "2_seed=2"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "config.yaml").write_text((run_config_dir / "config.yaml").read_text())
    with pytest.raises(FileNotFoundError) as refused:
        load_run_config(str(tmp_path), [])
    assert str(refused.value) == (
        f"{tmp_path} is a sweep's directory, not a run's: evaluate one of its 2 jobs, e.g. "
        f"python -m metalearn.evaluate {tmp_path / '2_seed=2'}"
    )


def test_evaluate_reads_a_baseline_config_saved_before_its_fine_tuning_keys(tmp_path):
    """A Baseline run saved before dampening and mini-batches existed fine-tuned with full
    batches and no dampening: its evaluation keeps that, and says so."""
    saved = compose_config(["+experiment=omniglot_5w1s_baseline_cpu"])
    del saved.algorithm.dampening
    del saved.algorithm.finetune_batch_size
    OmegaConf.save(saved, tmp_path / "config.yaml")
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        cfg = load_run_config(str(tmp_path), [])
    assert (cfg.algorithm.dampening, cfg.algorithm.finetune_batch_size) == (0.0, 0)
    assert "read algorithm.dampening=0.0, algorithm.finetune_batch_size=0" in printed.getvalue()
    new = compose_config(["+experiment=miniimagenet_5w1s_baseline"])  # the keys saved: as saved
    OmegaConf.save(new, tmp_path / "config.yaml")
    cfg = load_run_config(str(tmp_path), [])
    assert (cfg.algorithm.dampening, cfg.algorithm.finetune_batch_size) == (0.9, 4)


def test_evaluate_reads_a_config_saved_before_keys_were_renamed(run_config_dir, tmp_path):
    saved = OmegaConf.load(run_config_dir / "config.yaml")
    saved.algorithm.num_steps = 3  # the spellings before the rename, as old runs saved them
    del saved.algorithm.inner_steps
    saved.trainer.num_steps = 7
    del saved.trainer.meta_steps
    OmegaConf.save(saved, tmp_path / "config.yaml")
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        cfg = load_run_config(str(tmp_path), ["eval.num_tasks=5"])
    assert (cfg.algorithm.inner_steps, cfg.trainer.meta_steps, cfg.eval.num_tasks) == (3, 7, 5)
    assert "algorithm.num_steps -> algorithm.inner_steps" in printed.getvalue()
    saved.trainer.meta_steps = 9  # both spellings: which one was meant is unknown
    OmegaConf.save(saved, tmp_path / "config.yaml")
    with pytest.raises(ValueError, match="both trainer.num_steps and its new name"):
        load_run_config(str(tmp_path), [])


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--out", "/nonexistent/x.json"], ["--out /nonexistent/x.json: /nonexistent does"]),
        (["--out", "."], ["--out . is a directory"]),
        (["--which", "bset"], ["invalid choice: 'bset'", "usage: python -m metalearn.evaluate"]),
        (["--num-steps", "3"], ["unrecognized arguments: --num-steps 3", "usage:"]),
    ],
)
def test_evaluate_flags_are_checked_before_the_evaluation(run_config_dir, args, fragments):
    # An unwritable --out failed with a traceback after the whole evaluation; a bad flag
    # printed argparse's usage over several lines.
    result = run_in_process(str(run_config_dir), *args, module="metalearn.evaluate")
    error_line(result, *fragments)


def test_evaluate_without_a_run_directory_says_so():
    # "the following arguments are required: run_dir, overrides": the overrides are optional.
    result = run_in_process(module="metalearn.evaluate")
    line = error_line(result, "name the run directory to evaluate", "usage:")
    assert "overrides" not in line


def test_an_output_directory_that_cannot_be_created_is_one_line():
    # "is not writable: No such file or directory", without saying which setting to change.
    result = run_in_process(*TINY, "hydra.run.dir=/proc/metalearn-run")
    error_line(result, "'/proc/metalearn-run' cannot be written", "choose another hydra.run.dir")


def test_out_of_memory_is_one_line_naming_what_bounds_memory(tmp_path):
    # A meta-batch of 2e9 tasks asks XLA for 66 TB: a 48-line JaxRuntimeError traceback before.
    result = run_cli(*TINY, "trainer.meta_batch_size=2000000000", f"hydra.run.dir={tmp_path}")
    error_line(
        result,
        "out of memory on the device (RESOURCE_EXHAUSTED",
        "trainer.meta_batch_size",
        "trainer.shots or data.num_queries",  # examples per task, which it left out
    )


# A full disk at the second checkpoint: the manifest write fails with ENOSPC, as it does on a
# full file system (this started as a 487-line flood of orbax and TensorBoard tracebacks on a
# 300 kB tmpfs; the same one line is printed there, checked by hand).
FULL_DISK_AT_STEP_4 = """
import errno
import metalearn.runner.checkpoints as checkpoints
write_manifest = checkpoints.write_manifest
def full_at_step_4(directory, *args, **kwargs):
    if directory.rstrip("/").endswith("/4"):
        raise OSError(errno.ENOSPC, "No space left on device")
    return write_manifest(directory, *args, **kwargs)
checkpoints.write_manifest = full_at_step_4
"""


@pytest.mark.parametrize("key", ["data.data_dir", "data.manual_dir"])
def test_a_data_directory_that_is_a_file_is_one_line(tmp_path, key):
    # data_dir: a NotADirectoryError traceback; manual_dir: "does not exist", which it does.
    afile = tmp_path / "afile"
    afile.write_text("")
    for value, where in [(afile, ""), (afile / "sub", f": {afile}")]:
        result = run_in_process(*OMNIGLOT_TINY, f"{key}={value}", f"hydra.run.dir={tmp_path / 'r'}")
        error_line(result, f"omniglot_vinyals: {key}={value}{where} is a file, not a directory")


def test_a_full_disk_is_one_line_and_the_rerun_resumes(tmp_path):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FULL_DISK_AT_STEP_4)
    run_dir = tmp_path / "run"
    result = run_cli(*TINY, f"hydra.run.dir={run_dir}", env={"PYTHONPATH": str(inject)})
    error_line(
        result,
        f"no space left on the device that holds {run_dir} ([Errno 28] No space left on device)",
        f"rerun the same command with hydra.run.dir={run_dir} to resume",
    )
    result = run_cli(*TINY, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from step 2" in result.stdout + result.stderr


@pytest.mark.parametrize("override", ["eval.shots=[1,5]", "trainer.shots=3"])
def test_rl_runs_refuse_a_shot_count(tmp_path, override):
    # RL tasks ignored the shot count: eval.shots=[1,5] reported two rows of other random tasks.
    result = run_in_process(*RL_TINY, override, f"hydra.run.dir={tmp_path}")
    error_line(result, override.split("=")[0], "means nothing for an RL task")


def test_an_rl_nan_names_the_settings_trpo_uses(tmp_path):
    # The advice named optimizer.lr and optimizer.grad_clip_norm, which TRPO does not read.
    result = run_in_process(*RL_TINY, "algorithm.inner_lr=1e30", f"hydra.run.dir={tmp_path}")
    line = error_line(result, "non-finite", "lower algorithm.inner_lr or algorithm.max_kl (TRPO)")
    assert "optimizer" not in line


def test_a_locomotion_run_without_brax_is_one_line(tmp_path):
    # Installed without the locomotion extra: a 75-line traceback through Hydra, exit 1, that
    # ended in the right advice.
    missing = tmp_path / "site" / "brax"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'brax'\", name='brax')\n"
    )
    result = run_cli(
        "+experiment=rl_cheetah_vel_maml",
        "+debug=tiny",
        f"hydra.run.dir={tmp_path / 'run'}",
        env={**os.environ, "PYTHONPATH": str(missing.parent)},
    )
    error_line(
        result,
        "the locomotion environments need Brax",
        "pip install 'metalearn-jax[locomotion]'",
        "pip install '.[locomotion]'",
    )


def test_a_run_directory_with_glob_characters_is_refused(tmp_path):
    # Orbax globs for a checkpoint's pieces when it saves: under "x[1]" it skipped merging them
    # and the checkpoint could not be restored (it was then moved aside as damaged). Sweep job
    # directories replace those characters (eval.steps=[0,1] -> eval.steps=(0,1)).
    result = run_in_process(*TINY, f"hydra.run.dir='{tmp_path}/x[1]'")
    error_line(result, "contains one of []*?", "cannot be restored", "hydra.run.dir")
    assert not (tmp_path / "x[1]").exists()


def test_evaluate_out_never_replaces_a_record_of_the_run(run_config_dir):
    # --out RUN/config.yaml (or the training's eval.json, metrics.jsonl, ...) was replaced by
    # the evaluation's records, after the whole evaluation, with no more than a note.
    target = run_config_dir / "config.yaml"
    before = target.read_bytes()
    result = run_in_process(str(run_config_dir), "--out", str(target), module="metalearn.evaluate")
    error_line(result, f"--out {target} is a run's own record (config.yaml)", "eval_best.json")
    assert target.read_bytes() == before


def test_evaluate_out_never_replaces_another_runs_evaluation(run_config_dir, tmp_path):
    # evaluate A --out B/eval_best.json replaced B's record with A's numbers under B's name,
    # silently: eval_*.json are evaluate's own outputs, replaceable in the run evaluated only.
    other = tmp_path / "other"
    shutil.copytree(run_config_dir, other)
    target = other / "eval_best.json"
    target.write_text("[]")
    result = run_in_process(str(run_config_dir), "--out", str(target), module="metalearn.evaluate")
    error_line(result, f"--out {target} is a run's own record (eval_best.json)", "Nothing was")
    assert target.read_text() == "[]"


@pytest.mark.parametrize(
    "override, fragment",
    [
        # A group set to null: Hydra's "Config group override must be a string or a list.
        # Got NoneType" traceback (39 lines, exit 1).
        ("algorithm=null", "algorithm=null: a run needs an algorithm; choose one"),
        ("model=null", "model=null: a run needs a model"),
        ("+debug=null", "debug=null: to run without debug, leave the override out"),
        # A top-level entry deleted: MissingMandatoryValue / ConfigAttributeError tracebacks
        # (59 and 71 lines), .hydra/ and an empty train.log left behind.
        ("~algorithm", "~algorithm: algorithm cannot be deleted, a run needs it"),
        ("~seed", "~seed: seed cannot be deleted, a run needs it; set it instead (seed=...)"),
    ],
)
def test_an_override_that_leaves_out_a_part_a_run_needs_is_one_line(tmp_path, override, fragment):
    result = run_in_process(*TINY, override, f"hydra.run.dir={tmp_path / 'run'}")
    error_line(result, fragment)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, fragments",
    [
        # It ran as an experiment of its own (base_sinusoid), or failed to compose: "In
        # 'experiment/base_fewshot': ConfigKeyError raised while composing config: ...".
        (
            ["+experiment=base_fewshot"],
            ["experiment=base_fewshot holds what several", "omniglot_5w1s"],
        ),
        (["-m", "+experiment=sinusoid_maml,base_sinusoid"], ["experiment=base_sinusoid holds"]),
        # It said "algorithm.first_order is not a setting of algorithm (ReptileConfig: ...)", a
        # key the command line did not name.
        (["algorithm.name=reptile"], ["choose the algorithm with algorithm=reptile"]),
    ],
)
def test_train_refuses_what_is_no_option(args, fragments, tmp_path):
    result = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    error_line(result, *fragments)
    assert not (tmp_path / "run").exists() and not (tmp_path / "multirun").exists()


def test_evaluate_refuses_another_algorithm_name(run_config_dir):
    result = run_in_process(
        str(run_config_dir), "algorithm.name=reptile", module="metalearn.evaluate"
    )
    error_line(result, "evaluated with the algorithm it was trained with (algorithm=maml)")
