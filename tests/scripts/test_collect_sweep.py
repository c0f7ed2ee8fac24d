"""metalearn.tools.collect_sweep: a table of a sweep's runs; bad input is one line, exit 2."""

import json

import pytest

from metalearn.tools import check_eval_record
from metalearn.tools.collect_sweep import collect
from tests.cli import error_line, run_tool


def _run(sweep, name, overrides, mean=0.5):
    """A finished sweep job as Hydra and `metalearn.train` leave it (overrides, eval.json)."""
    run = sweep / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(overrides)
    record = {"metric": "mse", "shots": 5, "steps": 1, "mean": mean, "ci95": 0.1, "tasks": 10}
    (run / "eval.json").write_text(json.dumps([record]))
    return run


def test_csv_is_checked_before_collecting(tmp_path):
    _run(tmp_path / "sweep", "0_lr", "- optimizer.lr=0.1\n")
    for csv, fragments in [
        ("/nonexistent/x.csv", ["error: --csv /nonexistent/x.csv:", "/nonexistent does not exist"]),
        (str(tmp_path), [f"error: --csv {tmp_path} is a directory"]),
    ]:
        result = run_tool("collect_sweep", str(tmp_path / "sweep"), "--csv", csv)
        error_line(result, *fragments)
        assert result.stdout == ""
    result = run_tool("collect_sweep", str(tmp_path / "sweep"), "--csv", str(tmp_path / "t.csv"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "t.csv").read_text().startswith("run,optimizer.lr,metric")


def test_a_run_with_corrupt_overrides_is_listed_and_the_rest_tabulated(tmp_path):
    sweep = tmp_path / "sweep"
    _run(sweep, "0_lr=0.1", "- optimizer.lr=0.1\n", mean=0.25)
    bad = _run(sweep, "1_lr=0.2", "- optimizer.lr=0.2\n- [unclosed\n")
    not_a_list = _run(sweep, "2_lr=0.3", "optimizer.lr: 0.3\n")
    result = run_tool("collect_sweep", str(sweep))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert any(
        line.startswith("0_lr=0.1") and "0.2500" in line for line in result.stdout.splitlines()
    )
    assert f"{bad}: unreadable .hydra/overrides.yaml (" in result.stdout
    assert f"{not_a_list}: unreadable .hydra/overrides.yaml (not a list of overrides)" in (
        result.stdout
    )


def test_a_directory_without_runs_is_one_error_line(tmp_path):
    result = run_tool("collect_sweep", str(tmp_path))
    error_line(
        result, f"no run directories (with train.log, .hydra/ or status.json) under {tmp_path}"
    )
    # Runs, none with a readable eval.json: each listed, then one error line, exit 2.
    (tmp_path / "0_x" / ".hydra").mkdir(parents=True)
    result = run_tool("collect_sweep", str(tmp_path))
    error_line(result, f"no readable run under {tmp_path}: each is listed above")
    assert f"{tmp_path / '0_x'}: unfinished (no eval.json)" in result.stderr


def test_a_run_without_overrides_is_tabulated_and_named(tmp_path):
    # Its override columns were blank with nothing saying why.
    sweep = tmp_path / "sweep"
    _run(sweep, "0_lr=0.1", "- optimizer.lr=0.1\n", mean=0.25)
    bare = _run(sweep, "1_lr=0.2", "", mean=0.75)
    (bare / ".hydra" / "overrides.yaml").unlink()
    result = run_tool("collect_sweep", str(sweep))
    assert result.returncode == 0, result.stderr
    assert any(
        line.startswith("1_lr=0.2") and "0.7500" in line for line in result.stdout.splitlines()
    )
    assert f"{bare}: no .hydra/overrides.yaml, so its override columns are blank" in result.stdout


def test_a_malformed_status_record_is_not_a_traceback(tmp_path):
    # {} or [1] in status.json ended in KeyError / TypeError.
    sweep = tmp_path / "sweep"
    for i, text in enumerate(["{}", "[1]"]):
        run = _run(sweep, f"{i}_lr=0.{i + 1}", f"- optimizer.lr=0.{i + 1}\n", mean=0.25)
        (run / "status.json").write_text(text)
    result = run_tool("collect_sweep", str(sweep))
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if "0.2500" in line]) == 2


def test_csv_never_replaces_a_record_of_the_sweep(tmp_path):
    # --csv onto a job's eval.json, status.json or .hydra/overrides.yaml, or the sweep's
    # multirun.yaml, replaced it with the table, silently.
    sweep = tmp_path / "sweep"
    run = _run(sweep, "0_lr", "- optimizer.lr=0.1\n")
    (run / "status.json").write_text('{"status": "ok", "exit_code": 0, "message": ""}')
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for target in [
        run / "eval.json",
        run / "status.json",
        run / ".hydra" / "overrides.yaml",
        sweep / "multirun.yaml",
    ]:
        before = target.read_bytes()
        result = run_tool("collect_sweep", str(sweep), "--csv", str(target))
        error_line(result, f"--csv {target} is ", "Nothing was written", "sweep.csv")
        assert target.read_bytes() == before and result.stdout == ""
    # Another existing file is replaced, and a line says so.
    other = tmp_path / "old.csv"
    other.write_text("an older table\n")
    result = run_tool("collect_sweep", str(sweep), "--csv", str(other))
    assert result.returncode == 0, result.stderr
    assert f"note: --csv {other} exists: it will be replaced" in result.stderr
    assert other.read_text().startswith("run,optimizer.lr,metric")


def test_a_malformed_earlier_record_or_an_empty_eval_json_is_no_traceback(tmp_path):
    sweep = tmp_path / "sweep"
    refused = _run(sweep, "0_lr=0.1", "- optimizer.lr=0.1\n", mean=0.25)
    # A refused rerun whose "previous" is no record: a TypeError traceback.
    (refused / "status.json").write_text(
        '{"status": "refused", "exit_code": 2, "message": "x", "previous": 5}'
    )
    empty = _run(sweep, "1_lr=0.2", "- optimizer.lr=0.2\n")
    (empty / "eval.json").write_text("[]")  # it was left out of the table without a word
    result = run_tool("collect_sweep", str(sweep))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert any(line.startswith("0_lr=0.1") for line in result.stdout.splitlines())
    assert f"{empty}: eval.json holds no records" in result.stdout
    missing = run_tool("collect_sweep", str(tmp_path / "nowhere"))
    error_line(missing, "nowhere does not exist", "give a sweep's output directory")


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("mean", "0.35", "mean '0.35', not a number or null"),
        ("ci95", [0.1], "ci95 [0.1], not a number or null"),
        ("steps", -1, "steps -1, not a count"),
        ("shots", 5.0, "shots 5.0, not a count"),
        ("diverged", True, "diverged True, not a count"),
        ("metric", 3, "metric 3, not a metric's name"),
        ("median_ci95", [0.1], "median_ci95 [0.1], not a pair"),
        ("median_ci95", ["a", None], "median_ci95 ['a', None], not numbers or null"),
    ],
)
def test_a_hand_edited_record_is_listed_not_tabulated(tmp_path, key, value, fragment):
    # A mean of "0.35" was tabulated as it was, beside the numbers of the other runs.
    good = _run(tmp_path, "0_lr=0.1", "- optimizer.lr=0.1\n", mean=0.25)
    bad = _run(tmp_path, "1_lr=0.2", "- optimizer.lr=0.2\n")
    record = {**json.loads((bad / "eval.json").read_text())[0], key: value}
    (bad / "eval.json").write_text(json.dumps([record]))
    rows, missing, _ = collect(tmp_path)
    assert [(row["run"], row["mean"]) for row in rows] == [(good.name, 0.25)]
    assert len(missing) == 1 and missing[0][0] == bad
    assert missing[0][1].startswith("unreadable eval.json (a record with ")
    assert fragment in missing[0][1]


def test_the_records_a_run_writes_pass_the_check():
    record = {"metric": "return", "shots": 1, "steps": 1, "ways": 5, "mean": -17.0, "ci95": None}
    record |= {"median": -16, "median_ci95": [None, -15.5], "change": 3.2, "change_ci95": 1.1}
    record |= {"diverged": 0, "nonfinite": 0, "tasks": 40}
    check_eval_record(record)
    with pytest.raises(ValueError, match="without metric, shots, steps and mean"):
        check_eval_record({"metric": "mse", "shots": 5, "steps": 1})
