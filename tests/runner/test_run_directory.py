"""A rerun never damages a run directory; damaged checkpoints are detected and survived.

Every case goes through the CLI (``python -m metalearn.train`` / ``metalearn.evaluate``) as a
user would; the reference is one finished tiny run, copied for each test.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from metalearn.runner.checkpoints import CheckpointStore
from metalearn.runner.rundir import differences
from tests.cli import RL_TINY, checkout_env, communicated, finished, run_in_process
from tests.conftest import restore_latest_state, runner_of

TINY = ["+experiment=sinusoid_maml", "+debug=tiny"]
ROOT = Path(__file__).resolve().parents[2]


def cli(
    module: str, *args: str, timeout: int = 300, here: bool = False
) -> subprocess.CompletedProcess:
    """``python -m module args...`` as a process: a refusal's whole output, to its exit, is one
    line. ``here``: in this process, for a call whose exit status, files and messages are all
    that is checked."""
    if here:
        return run_in_process(*args, module=module)
    return finished([sys.executable, "-m", module, *args], timeout, cwd=ROOT, env=checkout_env())


def train(run_dir: Path, *overrides: str, here: bool = False) -> subprocess.CompletedProcess:
    return cli("metalearn.train", *TINY, f"hydra.run.dir={run_dir}", *overrides, here=here)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = train(run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(finished_run, target)
    return target


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory, by relative path: train.log aside (a refused process
    logs why), and .lock (it names the last process that opened the directory to train)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name not in ("train.log", ".lock")
    }


def assert_same_state(a: Path, b: Path) -> None:
    x, y = restore_latest_state(str(a)), restore_latest_state(str(b))
    for u, v in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y), strict=True):
        np.testing.assert_array_equal(u, v)


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_rerun_with_another_config_is_refused_before_anything_is_written(run_copy):
    overrides = run_copy / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text() + "# not in the copy under checkpoints/hydra\n")
    before = snapshot(run_copy)
    line = one_line_error(
        train(run_copy, "seed=5", "algorithm.inner_lr=0.02"),
        "different config",
        "seed 0 -> 5",
        "algorithm.inner_lr 0.001 -> 0.02",
        "trainer.allow_changes=[algorithm.inner_lr,seed]",
    )
    assert "Nothing was changed" in line
    assert snapshot(run_copy) == before  # config.yaml, .hydra/, checkpoints, metrics untouched
    # So it was refused by the GuardRunDirectory callback before Hydra wrote .hydra/: the task
    # would have put back the copy under checkpoints/hydra, without the line added above (the
    # callback had stopped checking when to_objects began refusing the hydra section).
    # The original run can still be evaluated from its own config.yaml.
    evaluated = cli("metalearn.evaluate", str(run_copy), "eval.num_tasks=2", here=True)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "evaluated the best checkpoint (step" in evaluated.stdout


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.meta_steps=-1"],
        ["optimizer.lr=-1"],
        # allowed by trainer.allow_changes and recorded, then refused when the algorithm is built
        ["algorithm.inner_lr=-0.01", "trainer.allow_changes=[algorithm.inner_lr]"],
    ],
    ids=["meta_steps", "lr", "allowed-inner_lr"],
)
def test_a_refused_value_leaves_the_run_directory_as_it_was(run_copy, overrides):
    # Hydra rewrote .hydra/ with the refused command line before the task checked it, so the
    # directory said its run had trainer.meta_steps=-1 (and collect_sweep tabulated its results
    # under it); an allowed change the algorithm then refused stayed in config.yaml and the
    # record, and the next plain rerun was refused for differing from it.
    before = snapshot(run_copy)
    one_line_error(train(run_copy, *overrides), "must be")
    assert snapshot(run_copy) == before
    resumed = train(run_copy, here=True)
    assert resumed.returncode == 0, resumed.stderr


# A tiny MAML-RL run: 2 meta-iterations of 2 tasks, one checkpoint, no validation.
RL_RUN = [*RL_TINY, "trainer.meta_steps=2", "trainer.eval_every=0"]


@pytest.fixture(scope="module")
def finished_rl_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("rl-reference") / "run"
    result = cli("metalearn.train", *RL_RUN, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def assert_refused_as_a_bad_value(run_dir: Path, rerun: list[str], message: str) -> None:
    """The rerun ends in the one line of the value's own check; the directory is untouched."""
    record = [run_dir / "config.yaml", run_dir / "checkpoints" / "config.json"]
    before, record_before = snapshot(run_dir), [p.read_bytes() for p in record]
    result = cli("metalearn.train", *rerun, f"hydra.run.dir={run_dir}")
    assert one_line_error(result) == f"error: {message}"
    assert result.stderr.strip().splitlines() == [f"error: {message}"], result.stderr
    assert "allow_changes" not in result.stderr and "different config" not in result.stderr
    assert [p.read_bytes() for p in record] == record_before
    assert snapshot(run_dir) == before


def test_a_bad_algorithm_value_on_a_rerun_is_refused_as_a_bad_value(run_copy):
    # The run directory's guard (GuardRunDirectory) compared the configs first, because the
    # algorithm checked its values only when its factory ran: it answered "holds a run with a
    # different config ... accept the change with 'trainer.allow_changes=[algorithm.inner_lr]'",
    # and only a rerun that did so was told that the value is refused.
    assert_refused_as_a_bad_value(
        run_copy, [*TINY, "algorithm.inner_lr=-1"], "algorithm.inner_lr must be > 0, got -1.0"
    )


def test_a_bad_rl_algorithm_value_on_a_rerun_is_refused_as_a_bad_value(finished_rl_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_rl_run, run_dir)
    assert_refused_as_a_bad_value(
        run_dir, [*RL_RUN, "algorithm.max_kl=-1"], "algorithm.max_kl must be > 0, got -1.0"
    )


def test_a_setting_dropped_from_the_command_line_is_a_difference_too():
    # A key only the stored run has (an old "+model.x=1" not given again) differs from absent.
    assert differences({"a": 1, "b": 2}, {"a": 1}) == {"b": (2, None)}
    assert differences({"a": 1}, {"a": 1, "c": 3}) == {"c": (None, 3)}


def test_an_optimizer_change_is_refused_and_the_newest_intact_step_is_the_latest(run_copy):
    one_line_error(train(run_copy, "optimizer.lr=0.002"), "optimizer.lr 0.001 -> 0.002")
    assert CheckpointStore(str(run_copy / "checkpoints"), 2).newest_intact_step() == 4


def test_an_allowed_section_does_not_allow_a_key_that_merely_starts_like_it(run_copy):
    # It was refused for the change it did not allow; now for the entry, naming the key.
    one_line_error(
        train(run_copy, "trainer.meta_steps=6", "trainer.allow_changes=[trainer.meta]"),
        "trainer.allow_changes: 'trainer.meta' is not a setting or section of the config",
        "did you mean trainer.meta_steps?",
    )


def test_the_advised_allowed_changes_resume_a_run_whose_algorithm_drops_settings(tmp_path):
    # Reptile pretraining continued with MAML: the refusal advised allow_changes naming
    # Reptile's own keys (algorithm.adam_b1, ...); the run then checked it again as training
    # started, against the config it had just recorded, and refused those keys as "not a
    # setting", so the advice could never be followed (the same command, rerun, too).
    run_dir = tmp_path / "run"
    assert train(run_dir, "algorithm=reptile", here=True).returncode == 0
    maml = ["algorithm=maml", "trainer.meta_steps=6"]
    advice = one_line_error(train(run_dir, *maml), "different config", "algorithm.adam_b1")
    allow = advice.split("accept the change with ")[1].strip("'")
    resumed = train(run_dir, *maml, allow, here=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout + resumed.stderr
    again = train(run_dir, *maml, allow, here=True)  # the same command line, on the finished run
    assert again.returncode == 0, again.stderr[-3000:]


def test_a_run_of_another_experiment_is_refused_without_advice_that_cannot_work(run_copy):
    # It advised allow_changes with 35 keys; following it was refused ('not a setting').
    before = snapshot(run_copy)
    result = cli("metalearn.train", *RL_TINY, f"hydra.run.dir={run_copy}")
    line = one_line_error(result, "holds a run of another experiment", 'data.name "sinusoid"')
    assert "allow_changes" not in line and "Choose a new hydra.run.dir" in line
    assert snapshot(run_copy) == before


def test_an_allowed_change_that_names_nothing_is_refused(run_copy, tmp_path):
    # trainer.allow_changes=[nonsense] was accepted, allowing nothing, on a fresh run too.
    for directory in (run_copy, tmp_path / "fresh"):
        allow = "trainer.allow_changes=[nonsense]"
        result = cli("metalearn.train", *TINY, f"hydra.run.dir={directory}", allow)
        one_line_error(result, "trainer.allow_changes: 'nonsense' is not a setting")
    assert not list((tmp_path / "fresh").glob("**/*"))  # nothing written
    # A key only the stored run has (maml's algorithm.first_order, absent from reptile) names
    # a setting: the refusal is the run's different config, which it lists.
    result = train(run_copy, "algorithm=reptile", "trainer.allow_changes=[algorithm.first_order]")
    one_line_error(result, "different config", "algorithm.name")


def test_a_directory_holding_only_a_finished_evaluation_is_a_run(run_copy):
    # Its checkpoints deleted, eval.json still says what the directory holds.
    for store in ("checkpoints", "best"):
        for step in (run_copy / store).iterdir():
            if step.name.isdigit():
                shutil.rmtree(step)
    one_line_error(
        train(run_copy, "trainer.resume=false"), "already holds a run (a finished evaluation)"
    )
    one_line_error(train(run_copy, "seed=5"), "different config: seed 0 -> 5")


def test_a_directory_holding_only_an_evaluation_of_evaluate_is_not_a_new_run(tmp_path):
    # A directory whose only file was evaluate's eval_best.json was taken for a new run
    # directory, and a run of any config was written beside that evaluation.
    directory = tmp_path / "run"
    directory.mkdir()
    (directory / "eval_best.json").write_text("[]")
    line = one_line_error(train(directory), "holds run outputs (eval_best.json) but no record")
    assert "Nothing was changed" in line
    assert snapshot(directory) == {"eval_best.json": b"[]"}  # as snapshot() reads a run


def test_an_allowed_change_resumes_and_is_recorded(run_copy):
    refused = train(run_copy, "trainer.meta_steps=6")
    one_line_error(
        refused, "trainer.meta_steps 4 -> 6", "trainer.allow_changes=[trainer.meta_steps]"
    )
    result = train(
        run_copy, "trainer.meta_steps=6", "trainer.allow_changes=[trainer.meta_steps]", here=True
    )
    assert result.returncode == 0, result.stderr
    assert "resumed from step 4" in result.stdout
    assert CheckpointStore(str(run_copy / "checkpoints"), 2).latest_step() == 6
    record = json.loads((run_copy / "checkpoints" / "config.json").read_text())
    assert record["config"]["trainer.meta_steps"] == 6
    assert record["changes"] == [{"from_step": 4, "changed": {"trainer.meta_steps": [4, 6]}}]


@pytest.mark.parametrize("changes", [5, [3], [{"from_step": 2}]])
def test_a_damaged_history_of_changes_is_dropped_not_fatal(run_copy, changes):
    # A TypeError escaped from recording a resumed run whose record listed changes as a number.
    path = run_copy / "checkpoints" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "changes": changes}))
    result = train(
        run_copy, "trainer.meta_steps=6", "trainer.allow_changes=[trainer.meta_steps]", here=True
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(path.read_text())
    assert record["changes"] == [{"from_step": 4, "changed": {"trainer.meta_steps": [4, 6]}}]


def test_unreadable_metrics_lines_are_set_aside_with_a_warning(run_copy):
    # A damaged line inside metrics.jsonl was deleted silently on resume.
    metrics = run_copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    damaged = '{"step": 2, "split": "tr\n'
    lines[1] = damaged
    metrics.write_text("".join(lines) + '{"step": 4, "spl')  # and a half-written last line
    result = train(
        run_copy, "trainer.meta_steps=6", "trainer.allow_changes=[trainer.meta_steps]", here=True
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert f"{metrics}: 1 unreadable line(s) (line 2) moved to {metrics}.unreadable" in output
    assert (run_copy / "metrics.jsonl.unreadable").read_text() == damaged
    kept = metrics.read_text().splitlines(keepends=True)
    assert lines[0] in kept and lines[2] in kept and damaged not in kept
    assert [json.loads(line)["step"] for line in kept][-1] == 6


def test_evaluate_without_config_yaml_reads_the_copy_kept_with_the_checkpoints(run_copy):
    # "config.yaml not found: is DIR a metalearn run directory?", though the copy was there.
    (run_copy / "config.yaml").unlink()
    copy = run_copy / "checkpoints" / "hydra" / "config.yaml"
    result = cli("metalearn.evaluate", str(run_copy), "eval.num_tasks=2", here=True)
    assert result.returncode == 0, result.stderr
    assert f"not found: reading the run's Hydra config, {copy}" in result.stderr
    assert "evaluated the best checkpoint" in result.stdout


def test_a_shortened_run_is_refused(run_copy):
    # Accepted before: the record said 2 steps for a run of 4 (summary.json's step).
    before = snapshot(run_copy)
    one_line_error(
        train(run_copy, "trainer.meta_steps=2", "trainer.allow_changes=[trainer.meta_steps]"),
        "holds checkpoints up to step 4, beyond trainer.meta_steps=2",
    )
    assert snapshot(run_copy) == before


@pytest.mark.parametrize(
    "damage",
    ["record deleted, config.yaml corrupt", "record corrupt", "record of another shape"],
)
def test_a_damaged_config_record_still_refuses_another_config(run_copy, damage):
    # A deleted record with a corrupt config.yaml let seed=5 resume seed 0's checkpoints
    # silently; a corrupt record was a bare JSON error line, one of another shape a traceback.
    record = run_copy / "checkpoints" / "config.json"
    if damage == "record deleted, config.yaml corrupt":
        record.unlink()
        (run_copy / "config.yaml").write_text("seed: [\n")
    else:
        record.write_text('{"fingerprint": "x", "conf' if damage == "record corrupt" else "[1, 2]")
    before = snapshot(run_copy)
    one_line_error(train(run_copy, "seed=5"), "different config", "seed 0 -> 5")
    assert snapshot(run_copy) == before  # .hydra/ included
    # Its own settings resume it, and the record is written again.
    result = train(run_copy, here=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text())["config"]["seed"] == 0


def test_a_run_whose_config_cannot_be_read_at_all_is_refused(run_copy):
    (run_copy / "checkpoints" / "config.json").write_text("{")
    (run_copy / "checkpoints" / "hydra" / "config.yaml").write_text("seed: [\n")
    (run_copy / "config.yaml").unlink()
    before = snapshot(run_copy)
    one_line_error(
        train(run_copy),
        "holds a run but its config cannot be read: ",
        "checkpoints/config.json (JSONDecodeError: ",
        "checkpoints/hydra/config.yaml (",
        "Restore one of these files from a copy to resume it",
    )
    assert snapshot(run_copy) == before


def test_a_change_of_parameter_shapes_is_refused_and_moves_nothing(run_copy):
    # Intact checkpoints that do not fit the config's parameters were moved to damaged/ as if
    # corrupt; evaluate then had nothing left, and a rerun trained again from step 0.
    before = snapshot(run_copy)
    fragments = ["the checkpoint of step 4", "is intact but does not fit", "the run's own values"]
    one_line_error(cli("metalearn.evaluate", str(run_copy), "model.hidden_sizes=[16]"), *fragments)
    assert snapshot(run_copy) == before
    # Resuming with the change allowed: refused too, and the allowed change is not recorded.
    allowed = ["trainer.meta_steps=6", "trainer.allow_changes=[model,trainer.meta_steps]"]
    one_line_error(train(run_copy, "model.hidden_sizes=[16]", *allowed), *fragments)
    assert {k: v for k, v in snapshot(run_copy).items() if k in before} == before
    assert not any("damaged" in k for k in snapshot(run_copy))
    # The run's own settings still resume it, with no trainer.allow_changes for the model.
    result = train(run_copy, *allowed, here=True)
    assert result.returncode == 0 and "resumed from step 4" in result.stdout, result.stderr


def test_resume_false_in_a_run_directory_is_refused(run_copy):
    before = snapshot(run_copy)
    one_line_error(
        train(run_copy, "trainer.resume=false"), "already holds a run", "new hydra.run.dir"
    )
    assert snapshot(run_copy) == before


def test_evaluate_without_best_names_the_latest_checkpoint(run_copy):
    shutil.rmtree(run_copy / "best")
    # a process: its warning is logged, with no handler but Python's last resort (stderr)
    result = cli("metalearn.evaluate", str(run_copy), "eval.num_tasks=2")
    assert result.returncode == 0, result.stderr
    assert "no intact best-on-validation checkpoint" in result.stdout + result.stderr
    assert "evaluated the latest checkpoint (step 4)" in result.stdout
    assert not (run_copy / "eval_best.json").exists()
    records = json.loads((run_copy / "eval_latest.json").read_text())
    assert {(r["checkpoint"], r["checkpoint_step"]) for r in records} == {("latest", 4)}


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _data_file(step_dir: Path) -> Path:
    """The largest array file of a checkpoint (the parameters and optimiser state)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize(
    "damage, target",
    [
        (_truncate, lambda d: d / "state" / "_METADATA"),
        (_flip, _data_file),
        (Path.unlink, lambda d: d / "metadata" / "metadata"),
        (Path.unlink, lambda d: d / "checksums.sha256"),  # killed before the manifest
    ],
    ids=["truncated", "flipped", "missing", "unfinished"],
)
def test_damaged_latest_checkpoint_falls_back_and_is_kept(finished_run, run_copy, damage, target):
    damaged_file = target(run_copy / "checkpoints" / "4")
    damage(damaged_file)
    stale = run_copy / "checkpoints" / "6.orbax-checkpoint-tmp-99"  # left by a killed save
    stale.mkdir()
    result = train(run_copy)
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr
    assert "Traceback" not in log
    warnings = [line for line in log.splitlines() if "damaged checkpoint" in line]
    assert len(warnings) == 1 and "step 4 (" in warnings[0] and "using step 2" in warnings[0]
    assert "resumed from step 2" in log
    (kept,) = (run_copy / "checkpoints" / "damaged").iterdir()
    assert kept.name.startswith("4-") and (kept / "state").is_dir()
    assert not stale.exists()
    assert_same_state(run_copy, finished_run)
    assert (run_copy / "eval.json").read_bytes() == (finished_run / "eval.json").read_bytes()
    lines = [json.loads(x) for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    keys = [(x["step"], x["split"]) for x in lines]
    assert sorted(keys) == sorted(set(keys)) == [(2, "train"), (2, "val"), (4, "train"), (4, "val")]


def _older_layout(run_dir: Path) -> None:
    """The run's checkpoints as a version without checksums saved them: no manifest, no marker."""
    for store in ("checkpoints", "best"):
        (run_dir / store / "checksummed").unlink()
        for manifest in (run_dir / store).rglob("checksums.sha256"):
            manifest.unlink()


def test_a_damaged_checkpoint_of_an_older_layout_falls_back_without_orbax_noise(
    finished_run, tmp_path
):
    # Without a manifest the restore is the test. Orbax closed its event loop at the first read
    # that failed, with the others pending; as each ended, TensorStore's thread printed a
    # "RuntimeError: Event loop is closed" traceback: in 25 of 60 such resumes (2 to 13 of 20,
    # with the machine's load), hence three tries here; test_checkpoints.py's
    # test_a_failed_restore_leaves_no_read_behind_to_print_tracebacks makes 20 in one process.
    for attempt in range(3):
        run_dir = tmp_path / f"run{attempt}"
        shutil.copytree(finished_run, run_dir)
        _older_layout(run_dir)
        for data in (run_dir / "checkpoints" / "4" / "state" / "d").iterdir():
            _truncate(data)
        result = train(run_dir)
        assert result.returncode == 0, result.stderr
        output = result.stdout + result.stderr
        for noise in ("Traceback", "Exception ignored", "Event loop is closed"):
            assert noise not in output, result.stderr
        warnings = [line for line in output.splitlines() if "damaged checkpoint" in line]
        assert len(warnings) == 1 and "step 4 (" in warnings[0] and "using step 2" in warnings[0]
        assert "resumed from step 2" in output
        assert_same_state(run_dir, finished_run)


def test_nan_message_names_the_newest_intact_checkpoint(run_copy):
    from omegaconf import OmegaConf

    from metalearn.config import to_objects

    _flip(_data_file(run_copy / "checkpoints" / "4"))
    runner = runner_of(to_objects(OmegaConf.load(run_copy / "config.yaml")), run_copy)
    message = str(runner.non_finite(6, "parameters"))
    runner.close()
    assert f"last intact checkpoint: step 2 in {run_copy / 'checkpoints'}" in message
    assert os.path.exists(run_copy / "checkpoints" / "4")  # reporting moves nothing


def test_evaluate_records_its_overrides_and_says_what_it_replaces(run_copy):
    # The file was replaced silently, and its records did not say which overrides made them.
    out = run_copy / "eval_best.json"
    out.write_text(json.dumps([{"metric": "loss", "checkpoint": "best"}]))  # an older file
    first = cli("metalearn.evaluate", str(run_copy), "eval.num_tasks=2", here=True)
    assert first.returncode == 0, first.stderr
    assert f"{out} will be replaced; its overrides are not recorded" in first.stderr
    assert {tuple(r["overrides"]) for r in json.loads(out.read_text())} == {("eval.num_tasks=2",)}
    again = ["eval.num_tasks=3", "eval.steps=[0,1]"]
    second = cli("metalearn.evaluate", str(run_copy), *again, here=True)
    assert second.returncode == 0, second.stderr
    assert (
        f"{out} was made with other overrides (eval.num_tasks=2): it will be replaced (now: "
        "eval.num_tasks=3 eval.steps=[0,1])"
    ) in second.stderr
    records = json.loads(out.read_text())
    assert {tuple(r["overrides"]) for r in records} == {("eval.num_tasks=3", "eval.steps=[0,1]")}
    same = cli("metalearn.evaluate", str(run_copy), *again, here=True)
    assert same.returncode == 0 and "will be replaced" not in same.stderr, same.stderr


def test_evaluate_of_the_initialisation_and_ctrl_c(run_copy):
    result = cli(
        "metalearn.evaluate", str(run_copy), "--which", "init", "eval.num_tasks=2", here=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((run_copy / "eval_init.json").read_text())[0]["checkpoint"] == "init"
    proc = subprocess.Popen(
        [sys.executable, "-m", "metalearn.evaluate", str(run_copy), "eval.num_tasks=1000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=checkout_env(),
    )
    for line in proc.stderr:  # Ctrl-C once the evaluation has started
        if line.startswith("evaluating on"):
            proc.send_signal(signal.SIGINT)
            break
    _, err = communicated(proc, 120)  # a safety limit: it exits at once after SIGINT
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "interrupted by SIGINT: nothing was written"
    assert not (run_copy / "eval_best.json").exists()


def stopped_before_its_first_checkpoint(run_copy: Path) -> Path:
    """The run directory as a run killed before its first checkpoint leaves it: its config
    recorded and some metrics logged, no checkpoint and no evaluation."""
    for store in ("checkpoints", "best"):
        for step_dir in (run_copy / store).iterdir():
            if step_dir.name.isdigit():
                shutil.rmtree(step_dir)
    shutil.rmtree(run_copy / "best")
    (run_copy / "eval.json").unlink()
    return run_copy


def test_a_run_stopped_before_its_first_checkpoint_is_not_taken_over_by_another_config(
    run_copy,
):
    # Its metrics.jsonl was replaced by the other config's, without a word.
    run_dir = stopped_before_its_first_checkpoint(run_copy)
    before = snapshot(run_dir)
    one_line_error(
        train(run_dir, "seed=5"),
        "holds a run (metrics.jsonl, stopped before its first checkpoint) with a different "
        "config: seed 0 -> 5",
    )
    assert snapshot(run_dir) == before
    # Its own config starts it again from step 0.
    result = train(run_dir, here=True)
    assert result.returncode == 0, result.stderr
    assert (run_dir / "eval.json").exists()


def test_run_outputs_with_no_record_of_their_config_are_refused(tmp_path):
    run_dir = tmp_path / "foreign"
    run_dir.mkdir()
    (run_dir / "eval.json").write_text("[]")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    before = snapshot(run_dir)
    one_line_error(train(run_dir), "holds run outputs (a finished evaluation) but no record")
    assert snapshot(run_dir) == before


def test_evaluate_with_every_checkpoint_damaged_says_where_they_went(run_copy):
    # It said "no checkpoint in DIR", after a warning had moved them, and gave no next step.
    for store in ("checkpoints", "best"):
        for step_dir in (run_copy / store).iterdir():
            if step_dir.name.isdigit():
                _flip(_data_file(step_dir))
    line = one_line_error(
        cli("metalearn.evaluate", str(run_copy)),
        f"no intact checkpoint in {run_copy / 'checkpoints'} (damaged ones were moved to "
        f"{run_copy / 'checkpoints' / 'damaged'}): nothing to evaluate",
        "--which init",
    )
    assert "hydra.run.dir=" in line


@pytest.mark.parametrize("store", ["checkpoints", "best", "tensorboard", ".hydra"])
def test_a_run_or_sweep_inside_another_runs_checkpoint_store_is_refused(run_copy, store):
    # A run directory under checkpoints/ was accepted; the next resume of the outer run took it
    # for a damaged checkpoint (a step-like name) and moved it, whole, to checkpoints/damaged/.
    # Under tensorboard/ its curves showed as the outer run's; under .hydra/, among its files.
    before = snapshot(run_copy)
    inner = run_copy / store / "30"
    one_line_error(train(inner), f"lies inside {run_copy / store}", "Nothing was written")
    swept = cli(
        "metalearn.train", "-m", *TINY, f"hydra.sweep.dir={run_copy / store / 'sweep'}", "seed=1"
    )
    one_line_error(swept, "hydra.sweep.dir=", f"lies inside {run_copy / store}")
    assert snapshot(run_copy) == before
    assert not inner.exists() and not (run_copy / store / "sweep").exists()
    resumed = train(run_copy, here=True)
    assert resumed.returncode == 0, resumed.stderr
    assert not (run_copy / "checkpoints" / "damaged").exists()


def test_a_second_process_in_a_directory_being_trained_in_is_refused(tmp_path):
    # Two processes in one directory had trained side by side (another seed, or the same
    # command twice): each deleted the other's checkpoints, the records said seed 1 while the
    # seed-0 process also reported success, and the last to finish wrote eval.json.
    from metalearn.runner.rundir import run_directory_held
    from tests.cli import run_cli

    run = tmp_path / "run"
    first = run_cli(*TINY, f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-2000:]
    records = {p: (run / p).read_bytes() for p in ("config.yaml", "eval.json", "metrics.jsonl")}
    hydra_files = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    with run_directory_held(str(run)):  # as a training process holds it
        for extra in ([], ["seed=1"], ["trainer.meta_steps=8", "trainer.allow_changes=[trainer]"]):
            second = run_cli(*TINY, *extra, f"hydra.run.dir={run}")
            assert second.returncode == 2
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"error: {run} is in use: process "), (
                lines
            )
            assert f"process {os.getpid()} on " in lines[0] and "Nothing was changed" in lines[0]
            for name, content in records.items():
                assert (run / name).read_bytes() == content, name
            assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == hydra_files
    # The lock goes with its process, however it ends: a kill -9 leaves nothing to clean up.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from metalearn.runner.rundir import run_directory_held\n"
            f"with run_directory_held({str(run)!r}):\n"
            "    print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=checkout_env(),
    )
    assert holder.stdout.readline().strip() == "held"
    blocked = run_cli(*TINY, f"hydra.run.dir={run}")
    assert blocked.returncode == 2 and f"process {holder.pid} on " in blocked.stderr
    holder.kill()
    holder.wait()
    resumed = run_cli(*TINY, f"hydra.run.dir={run}")  # the finished run, rerun: nothing to do
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (run / "eval.json").read_bytes() == records["eval.json"]


@pytest.mark.parametrize("part", [".hydra", "checkpoints", "checkpoints/hydra", "tensorboard"])
def test_evaluate_refuses_a_part_of_a_run_and_names_the_run(run_copy, part):
    # evaluate RUN/.hydra read Hydra's config.yaml there and wrote inside: best/ and
    # checkpoints/, and with --which init its eval_init.json, which the next training run copied
    # into RUN/checkpoints/hydra/; RUN/checkpoints was called a sweep's directory.
    before = snapshot(run_copy)
    result = cli("metalearn.evaluate", str(run_copy / part), "--which", "init")
    line = one_line_error(result, f"part of the run in {run_copy}: evaluate that run")
    assert f"python -m metalearn.evaluate {run_copy}" in line
    assert snapshot(run_copy) == before


@pytest.mark.parametrize(
    "name, kind",
    [("eval.json", "directory"), ("metrics.jsonl", "directory"), ("tensorboard", "file")]
    + [("best", "file")],
)
def test_a_run_file_of_the_wrong_kind_is_refused_before_anything_is_written(run_copy, name, kind):
    # A traceback where the run first wrote there (eval.json: after the whole evaluation,
    # leaving eval.json.tmp); best/ as a file: the final evaluation silently used the final
    # parameters instead of the best ones.
    path = run_copy / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.mkdir() if kind == "directory" else path.write_text("in the way\n")
    before = snapshot(run_copy)
    result = train(run_copy, "trainer.meta_steps=6", "trainer.allow_changes=[trainer.meta_steps]")
    one_line_error(result, f"{path} is a {kind}, where the run keeps its {name}", "Move it away")
    assert snapshot(run_copy) == before


def test_an_unreadable_summary_is_kept_aside_when_a_rerun_writes_its_own(run_copy):
    # It was replaced without a word, and with it the times of the processes it listed.
    (run_copy / "summary.json").write_text('{"wall_seconds": 12.5, "earlier_proc')
    result = train(run_copy, here=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "summary.json could not be read (JSONDecodeError" in result.stdout + result.stderr
    kept = run_copy / "summary.json.unreadable"
    assert kept.read_text() == '{"wall_seconds": 12.5, "earlier_proc'
    assert json.loads((run_copy / "summary.json").read_text())["earlier_processes"] == []


def test_a_record_whose_newline_was_never_written_is_kept_on_its_own_line(tmp_path):
    """A kill between a record's JSON and its newline leaves a readable last line: the resumed
    writer keeps it, and the next record starts a line of its own."""
    from metalearn.runner.reporting import MetricsWriter

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "split": "train"}\n{"step": 2, "split": "train"}')
    writer = MetricsWriter(str(tmp_path), resume_step=2)
    writer.write({"step": 3, "split": "train"})
    writer.close()
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]
