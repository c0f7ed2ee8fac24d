"""The plot scripts produce PNGs from a real (tiny) run directory."""

import json
import math
import shutil

import pytest

from tests.cli import error_line, run_tool


def test_learning_curves_and_figure2_from_a_run(finished_tiny_run, tmp_path):
    run = finished_tiny_run.path
    for tool, extra in [("plot_learning_curves", []), ("plot_sinusoid", ["--shots", "5"])]:
        out = tmp_path / f"{tool}.png"
        result = run_tool(tool, str(run), *extra, "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = run_tool("plot_learning_curves", str(tmp_path / "x"))
    assert missing.returncode == 2 and "not found" in missing.stderr


def _rl_run(directory, name, means):
    """A run directory as `python -m metalearn.train` leaves it: eval.json and config.yaml."""
    directory.mkdir()
    records = [
        {"metric": "return", "shots": 1, "steps": s, "mean": m, "ci95": 1.0, "tasks": 100}
        for s, m in enumerate(means)
    ]
    (directory / "eval.json").write_text(json.dumps(records))
    (directory / "config.yaml").write_text(f"name: {name}\n")
    return directory


def test_rl_returns_figure_and_table_from_run_directories(tmp_path):
    maml = _rl_run(tmp_path / "a", "rl_nav2d_maml", [-40.0, -12.0, -8.0, -7.5])
    random = _rl_run(tmp_path / "b", "rl_nav2d_random", [-70.0, -68.0, -66.0, -65.0])
    out = tmp_path / "returns.png"
    result = run_tool("plot_rl_returns", str(maml), str(random), "--out", str(out), "--table")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| rl_nav2d_maml | -40.00 ± 1.00 | -12.00 ± 1.00 | -8.00 ± 1.00 | -7.50 ± 1.00 |" in (
        result.stdout
    )
    bad = run_tool("plot_rl_returns", str(maml), str(tmp_path / "missing"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "eval.json" in bad.stderr


def test_rl_returns_from_an_evaluation_file(tmp_path):
    """A checkpoint re-evaluated by `metalearn.evaluate --out FILE` stands for its run."""
    maml = _rl_run(tmp_path / "a", "rl_cheetah_dir_maml", [-40.0, -12.0, -8.0, -7.5])
    later = maml / "eval_latest_100_tasks.json"
    records = json.loads((maml / "eval.json").read_text())
    later.write_text(json.dumps([{**r, "mean": r["mean"] + 1.0} for r in records]))
    result = run_tool(
        "plot_rl_returns", str(maml), str(later), "--out", str(tmp_path / "r.png"), "--table"
    )
    assert result.returncode == 0, result.stderr
    assert "| rl_cheetah_dir_maml | -40.00 ± 1.00 |" in result.stdout
    assert "| rl_cheetah_dir_maml (eval_latest_100_tasks) | -39.00 ± 1.00 |" in result.stdout


def test_rl_training_curves_on_a_linear_axis_and_a_named_metric(tmp_path):
    run = tmp_path / "rl"
    run.mkdir()
    lines = [
        {"split": "train", "step": s, "train/pre_return": -40.0 + s, "train/post_return": -30.0}
        for s in (1, 2, 3)
    ]
    lines.append(
        {
            "split": "val",
            "step": 3,
            "eval": [{"metric": "return", "shots": 1, "steps": 1, "mean": -20.0, "ci95": 2.0}],
        }
    )
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "curves.png"
    args = ["--metrics", "pre_return,post_return", "--out", str(out)]
    result = run_tool("plot_learning_curves", str(run), *args)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run_tool("plot_learning_curves", str(run), "--metrics", "reward")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")
    assert "no training metric reward" in bad.stderr and "post_return" in bad.stderr


def _eval_record(steps, mean, ci95, tasks=40):
    """One record as `python -m metalearn.evaluate --out FILE` writes it (mean None: all tasks
    non-finite; ci95 None: fewer than two finite tasks)."""
    nonfinite = tasks if mean is None else 0
    return {
        "metric": "return",
        "shots": 1,
        "steps": steps,
        "mean": mean,
        "ci95": ci95,
        "median": mean,
        "median_ci95": [None, None] if ci95 is None else [mean - ci95, mean + ci95],
        "nonfinite": nonfinite,
        "diverged": nonfinite,
        "tasks": tasks,
        "change": None,
        "change_ci95": None,
        "checkpoint": "best",
        "checkpoint_step": 10,
    }


def test_rl_returns_with_a_non_finite_mean_and_an_unknown_interval(tmp_path):
    """A point whose every task is non-finite (mean null) is left out of the plot and shown as
    non-finite in the table; an unknown interval (ci95 null, e.g. one task) is not shown as 0."""
    records = [
        _eval_record(0, -40.0, 2.0),
        _eval_record(1, None, None),
        _eval_record(2, -10.0, None, tasks=1),
    ]
    (tmp_path / "eval_best.json").write_text(json.dumps(records, indent=2))
    one_task = tmp_path / "one_task.json"
    one_task.write_text(json.dumps([_eval_record(0, -50.0, None, tasks=1)]))
    out = tmp_path / "returns.png"
    result = run_tool(
        "plot_rl_returns",
        str(tmp_path / "eval_best.json"),
        str(one_task),
        *["--labels", "MAML", "one", "--out", str(out), "--table"],
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| MAML | -40.00 ± 2.00 | non-finite | -10.00 ± n/a |" in result.stdout
    assert "| one | -50.00 ± n/a |  |  |" in result.stdout
    assert "± 0.00" not in result.stdout


@pytest.mark.parametrize(
    "text", ['{"a": 1}', "", "not json", "[1, 2]", '[{"metric": "return"}]', '"return"']
)
def test_rl_returns_refuses_a_file_that_is_not_a_list_of_records(tmp_path, text):
    path = tmp_path / "eval.json"
    path.write_text(text)
    result = run_tool("plot_rl_returns", str(path), "--out", str(tmp_path / "r.png"))
    error_line(result, str(path), "not an eval.json list of records")
    result = run_tool("plot_rl_returns", str(tmp_path), "--out", str(tmp_path / "r.png"))
    error_line(result, str(path), "not an eval.json list of records")


def test_rl_returns_checks_out_before_plotting(tmp_path):
    run = _rl_run(tmp_path / "a", "rl_nav2d_maml", [-40.0, -12.0])
    for out, fragments in [
        ("/nonexistent/x.png", ["/nonexistent/x.png", "/nonexistent does not exist"]),
        (str(tmp_path / "x.txt"), ["x.txt", "'.txt'", ".png"]),
        (str(tmp_path), [str(tmp_path), "is a directory"]),
    ]:
        result = run_tool("plot_rl_returns", str(run), "--out", out, "--table")
        error_line(result, "--out", *fragments)
    assert not (tmp_path / "x.txt").exists()
    result = run_tool("plot_rl_returns", str(run), "--out", str(tmp_path / "r.pdf"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r.pdf").read_bytes()[:4] == b"%PDF"


def _metrics_lines():
    train = [{"split": "train", "step": s, "train/loss": 1.0 / s} for s in (1, 2, 3)]
    val = {
        "split": "val",
        "step": 3,
        "eval": [{"metric": "mse", "shots": 5, "steps": 1, "mean": 0.5, "ci95": 0.1}],
    }
    return [json.dumps(x) for x in [*train, val]]


def test_learning_curves_skip_a_half_written_last_line(tmp_path):
    """A run killed (or still running) mid-write leaves a partial last line: skipped, noted."""
    run = tmp_path / "run"
    run.mkdir()
    lines = _metrics_lines()
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n" + lines[-1][:25])
    out = tmp_path / "curves.png"
    result = run_tool("plot_learning_curves", str(run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"note: {run / 'metrics.jsonl'}: skipped its unreadable last line 5" in result.stderr
    # Elsewhere an unreadable line is damage: one error line with the file and line number.
    lines.insert(1, lines[1][:25])
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = run_tool("plot_learning_curves", str(run), "--out", str(out))
    error_line(result, f"{run / 'metrics.jsonl'}, line 2", "unreadable")


def test_learning_curves_with_nothing_to_plot(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    out = tmp_path / "curves.png"
    result = run_tool("plot_learning_curves", str(run), "--out", str(out))
    error_line(result, str(run / "metrics.jsonl"), "nothing to plot", '"split": "train"')
    assert not out.exists()
    # Training records only (before the first validation): the training panel, no warning.
    (run / "metrics.jsonl").write_text("\n".join(_metrics_lines()[:3]) + "\n")
    result = run_tool("plot_learning_curves", str(run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "no validation records" in result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--shots", "0"], ["--shots", ">= 1", "got 0"]),
        (["--shots", "-3"], ["--shots", ">= 1", "got -3"]),
        (["--steps", "-1", "5"], ["--steps", ">= 1", "got -1 5"]),
        ([], ["has no config.yaml", "metalearn run directory"]),
    ],
)
def test_plot_sinusoid_refuses_bad_flags_and_a_missing_run(tmp_path, flags, fragments):
    run = tmp_path / "nowhere"
    result = run_tool("plot_sinusoid", str(run), *flags, "--out", str(tmp_path / "s.png"))
    error_line(result, *fragments)


def test_learning_curves_refuse_a_record_without_split_and_check_out_first(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = _metrics_lines()
    lines.insert(1, json.dumps({"step": 3, "train/loss": 1.0}))  # a KeyError traceback before
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = run_tool("plot_learning_curves", str(run), "--out", str(tmp_path / "c.png"))
    error_line(result, f"{run / 'metrics.jsonl'}, line 2", "without 'split' and 'step'")
    result = run_tool("plot_learning_curves", str(run), "--out", "/nonexistent/c.png")
    error_line(result, "--out /nonexistent/c.png: /nonexistent does not exist")


def test_rl_returns_label_without_a_readable_config(tmp_path):
    # A corrupt config.yaml beside an evaluation file ended the default label in a yaml
    # traceback; a file named in the current directory got the label " (stem)".
    run = tmp_path / "myrun"
    run.mkdir()
    (run / "eval_best.json").write_text(json.dumps([_eval_record(0, -40.0, 2.0)]))
    (run / "config.yaml").write_text("name: [unclosed\n")
    out = tmp_path / "r.png"
    result = run_tool("plot_rl_returns", str(run / "eval_best.json"), "--out", str(out), "--table")
    assert result.returncode == 0, result.stderr
    assert "| myrun (eval_best) |" in result.stdout


def test_rl_returns_refuses_two_runs_with_the_same_label(tmp_path):
    # Both were kept under one label: one table row and one line, the second run's numbers.
    maml = _rl_run(tmp_path / "a", "rl_nav2d_maml", [-40.0, -12.0])
    again = _rl_run(tmp_path / "b", "rl_nav2d_maml", [-70.0, -68.0])
    out = tmp_path / "r.png"
    result = run_tool("plot_rl_returns", str(maml), str(again), "--out", str(out), "--table")
    error_line(result, "'rl_nav2d_maml'", "distinct --labels")
    labels = ["--labels", "A", "A", "--out", str(out)]
    error_line(run_tool("plot_rl_returns", str(maml), str(again), *labels), "'A'", "--labels")
    assert not out.exists()


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("steps", "1", "steps '1'"),
        ("steps", True, "steps True"),
        ("mean", "x", "mean 'x'"),
        ("ci95", "n/a", "ci95 'n/a'"),
        # Past the check before: a 169-line traceback from matplotlib's ticks, an
        # OverflowError traceback, and "error: 'yerr' must not contain negative values".
        ("steps", 10**30, "steps 1000000000000000000000000000000, not a count"),
        ("mean", 10**400, "not a number or null"),
        ("ci95", -1.0, "ci95 -1.0: an interval's half-width is >= 0"),
    ],
)
def test_rl_returns_refuses_a_malformed_value(tmp_path, key, value, fragment):
    # Each ended in a TypeError traceback (or, for steps alone in its file, a plot of strings).
    records = [_eval_record(0, -40.0, 2.0), {**_eval_record(1, -12.0, 1.0), key: value}]
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(records))
    result = run_tool("plot_rl_returns", str(path), "--out", str(tmp_path / "r.png"))
    error_line(result, str(path), "not an eval.json list of records", fragment)


@pytest.mark.parametrize(
    "flags", [["--labels", "$\\foo$"], ["--title", "$x^$"], ["--out", "r.pgf"]]
)
def test_rl_returns_says_in_one_line_what_matplotlib_cannot_draw(tmp_path, flags):
    # Text between two $ is TeX math to matplotlib: an unparsable label or title printed its
    # parser's 4-line report after a bare "error:"; .pgf without LaTeX, an 89-line traceback.
    run = _rl_run(tmp_path / "a", "rl_nav2d_maml", [-40.0, -12.0])
    out = ["--out", str(tmp_path / "r.png")] if flags[0] != "--out" else []
    flags = [str(tmp_path / f) if f.endswith(".pgf") else f for f in flags]
    result = run_tool("plot_rl_returns", str(run), *out, *flags)
    if flags[0] == "--out" and shutil.which("xelatex"):  # this machine can write it
        assert result.returncode == 0, result.stderr
        return
    error_line(result, "matplotlib cannot write", "write a dollar sign as \\$")


def test_rl_returns_writes_exactly_the_out_path_given(tmp_path):
    # --out without an extension said "wrote .../returns" but wrote .../returns.png.
    run = _rl_run(tmp_path / "a", "rl_nav2d_maml", [-40.0, -12.0])
    out = tmp_path / "returns"
    result = run_tool("plot_rl_returns", str(run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "returns.png").exists()


@pytest.mark.parametrize(
    "tool", ["plot_rl_returns", "plot_learning_curves", "plot_sinusoid", "collect_sweep"]
)
@pytest.mark.parametrize("args", [[], ["RUN", "--bogus"]], ids=["nothing", "unknown-flag"])
def test_a_tool_called_wrongly_says_so_in_one_line(tool, args):
    # argparse printed its usage block (five lines for plot_rl_returns) before the error.
    result = run_tool(tool, *args)
    error_line(result, f"; usage: python -m metalearn.tools.{tool} [-h]")
    assert result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize(
    "damage, fragments",
    [
        ("directory", ["metrics.jsonl cannot be read (IsADirectoryError"]),
        ("bytes", ["metrics.jsonl cannot be read (UnicodeDecodeError"]),
        ("string", ["metrics.jsonl, line 2", "train/loss is 'x', not a number"]),
        ("eval", ["metrics.jsonl, line 2", "eval is 5, not a list"]),
        ("entry", ["metrics.jsonl, line 2", "a record without metric, shots, steps and mean"]),
    ],
)
def test_learning_curves_on_a_damaged_metrics_file(tmp_path, damage, fragments):
    # A directory, a traceback; bytes, the decode error without the file's name; a string
    # value, an eval that is no list, an entry without its keys: TypeError/KeyError tracebacks.
    run = tmp_path / "run"
    run.mkdir()
    lines = _metrics_lines()
    bad = {
        "string": {"split": "train", "step": 2, "train/loss": "x"},
        "eval": {"split": "val", "step": 2, "eval": 5},
        "entry": {"split": "val", "step": 2, "eval": [{"mean": 0.5}]},
    }
    if damage == "directory":
        (run / "metrics.jsonl").mkdir()
    elif damage == "bytes":
        (run / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    else:
        lines.insert(1, json.dumps(bad[damage]))
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "c.png"
    error_line(run_tool("plot_learning_curves", str(run), "--out", str(out)), *fragments)
    assert not out.exists()


def test_learning_curves_out_is_checked_and_written_as_given(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(_metrics_lines()) + "\n")
    before = (run / "metrics.jsonl").read_bytes()
    # matplotlib refused '.jsonl' only after reading the runs, without naming --out.
    result = run_tool("plot_learning_curves", str(run), "--out", str(run / "metrics.jsonl"))
    error_line(result, f"--out {run / 'metrics.jsonl'}: cannot write '.jsonl' files")
    assert (run / "metrics.jsonl").read_bytes() == before
    # "--metrics ," drew every metric.
    error_line(run_tool("plot_learning_curves", str(run), "--metrics", ","), "names no metric")
    # Without an extension it wrote OUT.png and said "wrote OUT".
    out = tmp_path / "curves"
    result = run_tool("plot_learning_curves", str(run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "curves.png").exists()


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("", ["config.yaml is empty or half-written"]),
        ("algorithm: [1\n", ["config.yaml cannot be read (ParserError"]),
    ],
)
def test_plot_sinusoid_on_an_empty_or_corrupt_config(tmp_path, text, fragments):
    # A 42-line ConfigAttributeError / 52-line yaml ParserError traceback.
    (tmp_path / "config.yaml").write_text(text)
    result = run_tool("plot_sinusoid", str(tmp_path), "--out", str(tmp_path / "s.png"))
    error_line(result, *fragments, "restore it from a copy")


def test_plot_sinusoid_refuses_the_same_step_count_twice(tmp_path):
    # --steps 1 1 drew two lines under one legend entry.
    result = run_tool("plot_sinusoid", str(tmp_path), "--steps", "1", "1")
    error_line(result, "--steps must be two different integers >= 1, got 1 1")


def test_rl_returns_with_a_nan_an_empty_label_or_a_supervised_run(tmp_path):
    run = _rl_run(tmp_path / "a", "rl_nav2d_maml", [-40.0, -12.0])
    out = tmp_path / "r.png"
    # A NaN in a file edited by hand: the table read "nan ± inf".
    nan = {**_eval_record(1, -12.0, 1.0), "mean": math.nan, "ci95": math.inf}
    (run / "eval.json").write_text(json.dumps([_eval_record(0, -40.0, 2.0), nan]))
    result = run_tool("plot_rl_returns", str(run), "--out", str(out), "--table")
    assert result.returncode == 0, result.stderr
    assert "| rl_nav2d_maml | -40.00 ± 2.00 | non-finite |" in result.stdout
    # An empty label: matplotlib's two-line UserWarning, and a line without a legend entry.
    result = run_tool("plot_rl_returns", str(run), "--labels", " ", "--out", str(out))
    error_line(result, "--labels: label 1 is empty")
    # A supervised run among RL ones: the line now says which metrics it has, and what to use.
    sin = tmp_path / "sin"
    sin.mkdir()
    mse = {"metric": "mse", "shots": 5, "steps": 0, "mean": 1.0}
    (sin / "eval.json").write_text(json.dumps([mse]))
    result = run_tool("plot_rl_returns", str(run), str(sin), "--out", str(out))
    error_line(result, "no 'return' records (its metrics: mse)", "plot_learning_curves")
