"""scripts/bench_run_step.py: one JSONL row per group size, on the devices and threads asked."""

import json
import subprocess
import sys

from tests.cli import REPO


def test_rows_per_group_size_on_the_devices_asked(tmp_path):
    out = tmp_path / "rows.jsonl"
    command = [
        sys.executable, str(REPO / "scripts" / "bench_run_step.py"), "--runs", "1,2",
        "--devices", "2", "--repeat", "1", "--out", str(out),
    ]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["runs"], r["devices"], r["threads"]) for r in rows] == [(1, 2, "one"), (2, 2, "one")]
    assert all(r["ms_per_run_step"] > 0 and r["steps_per_call"] == 100 for r in rows)
    assert rows == [
        json.loads(line) for line in finished.stdout.splitlines() if line.startswith("{")
    ]
