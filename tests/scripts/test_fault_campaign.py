"""The fault campaign, small: two kill -9 and two damaged checkpoints, each resumed identically.

The full campaign (20 kills, 10 corruptions) is ``python scripts/fault_campaign.py``.
"""

import json

import pytest

from tests.cli import run_script


@pytest.mark.slow
def test_small_fault_campaign_ends_identical(tmp_path):
    result = run_script(
        "fault_campaign.py",
        "--kills=2",
        "--corruptions=2",
        "--seed=1",
        f"--workdir={tmp_path}",
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results) == 4 and all(r["ok"] for r in results)
    assert "summary: 4 of 4 trials identical" in result.stdout


def test_bad_counts_are_refused():
    result = run_script("fault_campaign.py", "--kills=-1", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --kills and --corruptions must be >= 0"
