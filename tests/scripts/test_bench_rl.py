"""Smoke tests of scripts/bench_rl.py: metalearn's MAML-RL meta-iteration against the peer."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

from tests.cli import error_line, run_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
HAVE_TORCH = importlib.util.find_spec("torch") is not None
FIELDS = {
    "case", "impl", "device", "s_per_iter", "s_min", "seconds", "env_steps_per_iter",
    "env_steps_per_s", "compile_s", "first_iter_s", "tasks", "rollouts", "iters", "warmup",
    "host", "cpu", "load_1m",
}  # fmt: skip


@pytest.fixture
def bench_rl(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_rl

    return bench_rl


def test_small_side_by_side_rows(bench_rl, tmp_path, capsys):
    out = tmp_path / "rl.jsonl"
    impls = "metalearn,torch" if HAVE_TORCH else "metalearn"
    argv = ["--impl", impls, "--tasks", "2", "--rollouts", "2", "--iters", "2", "--warmup", "1"]
    bench_rl.main([*argv, "--task-batching", "vmap,auto", "--no-isolate", "--json", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # metalearn once per task batching (auto: a loop over the tasks on this CPU)
    assert [r["impl"] for r in rows] == ["metalearn", *impls.split(",")]
    assert [r["strategy"] for r in rows[:2]] == ["vmap", "map"]
    for row in rows:
        assert set(row) >= FIELDS, FIELDS - set(row)
        assert (row["tasks"], row["rollouts"], len(row["seconds"])) == (2, 2, 2)
        assert row["s_per_iter"] > 0 and row["env_steps_per_s"] > 0
        # 2 tasks x (2 pre + 2 post rollouts) x horizon 100; the peer stops early only when
        # every rollout of a batch has reached its goal
        assert 0 < row["env_steps_per_iter"] <= 800
    assert rows[0]["env_steps_per_iter"] == 800 and rows[0]["compile_s"] > 0
    assert "s/iter" in capsys.readouterr().out


def test_table_ratio(bench_rl):
    base = {"s_min": 1.0, "env_steps_per_s": 1.0, "compile_s": 0.0, "first_iter_s": 1.0}
    rows = [
        {**base, "impl": "metalearn", "s_per_iter": 0.5, "load_1m": 0.1},
        {**base, "impl": "torch", "s_per_iter": 10.0, "load_1m": 0.1},
    ]
    out = io.StringIO()
    bench_rl.print_table(rows, out)
    assert "20.0x" in out.getvalue()


def test_bad_arguments_are_one_error_line():
    error_line(run_script("bench_rl.py", "--impl", "jax"), "unknown impl 'jax'")
    error_line(run_script("bench_rl.py", "--tasks", "0"), "at least 1")
    error_line(run_script("bench_rl.py", "--task-batching", "pmap"), "'pmap' is not one of")


def test_compute_floor_counts_work_that_grows_with_the_samples(monkeypatch):
    # The Fisher-vector product's FLOPs (two unrolled products minus one) are per-sample work:
    # twice the rollouts, twice the FLOPs; the floor is that work over the measured rate.
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import jax
    from bench_rl_profile import compute_floor

    from metalearn.rl.inner import InnerConfig
    from metalearn.rl.maml_rl import MAMLRLConfig
    from metalearn.rl.policy import init_policy
    from metalearn.rl.trpo import TRPOConfig

    params = init_policy(jax.random.key(0), 2, 2, hidden=(16, 16))
    floors = []
    for rollouts in (2, 4):
        cfg = MAMLRLConfig(
            num_tasks=2,
            num_post_rollouts=rollouts,
            inner=InnerConfig(num_rollouts=rollouts),
            trpo=TRPOConfig(cg_iters=3),
        )
        floors.append(compute_floor(params, jax.random.key(1), cfg))
    small, large = floors
    assert 1.8 < large["one FVP (GFLOP)"] / small["one FVP (GFLOP)"] < 2.2
    parts = ("meta-gradient", "linearisation", "one FVP", "one line-search evaluation")
    assert all(small[f"{part} (GFLOP)"] > 0 for part in parts)
    total = small["meta-gradient + TRPO step with 3 FVPs (GFLOP)"]
    assert total > 3 * small["one FVP (GFLOP)"]
    rate = small["best matrix-product rate (GFLOP/s)"]
    assert small["floor: that work at that rate (ms)"] == pytest.approx(1e3 * total / rate)
