"""Each command-line entry point started as a process, as a user starts it: its module runs
``main`` and exits with its status (the other tests call ``main(argv)`` in their own process)."""

import pytest

from tests.cli import error_line, run_cli

TOOLS = ["collect_sweep", "plot_learning_curves", "plot_rl_returns", "plot_sinusoid"]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_started_as_a_process_reports_a_missing_run_in_one_line(tool, tmp_path):
    result = run_cli(str(tmp_path / "missing"), module=f"metalearn.tools.{tool}")
    error_line(result, str(tmp_path / "missing"))


def test_prepare_data_started_as_a_process_names_what_it_needs():
    error_line(run_cli(module="metalearn.tools.prepare_data"), "data=")


def test_evaluate_started_as_a_process_names_the_run_it_needs():
    error_line(run_cli(module="metalearn.evaluate"), "name the run directory to evaluate")
