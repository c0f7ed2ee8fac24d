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


def test_the_plain_step_computes_what_the_runners_step_computes(tmp_path, monkeypatch):
    """The plain-JAX step the runner is timed against is the same meta-step: two runs from the
    runner's initial state and keys reach the runner's parameters after 20 steps (an inner rate
    twice the algorithm's misses them by 4e-4, relative)."""
    import jax
    import numpy as np

    from metalearn.config import to_objects
    from metalearn.runner.run import Runner
    from metalearn.runner.rundir import RunDirectory
    from tests.conftest import compose_config, experiment_of

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from bench_run_step import plain_sinusoid_call

    configs = [
        to_objects(compose_config(["+experiment=sinusoid_maml", f"seed={seed}"])) for seed in (0, 1)
    ]
    experiments = [experiment_of(cfg) for cfg in configs]
    dirs = [RunDirectory(str(tmp_path / str(i)), cfg) for i, cfg in enumerate(configs)]
    runner = Runner(experiments, dirs)
    state, _ = runner.train_call(runner.initial_state, 20)
    call, plain = plain_sinusoid_call(experiments, 20)
    params, opt_state, steps, _ = call(plain)
    assert np.asarray(steps).tolist() == np.asarray(state.step).tolist() == [20, 20]
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(state.meta_params), strict=True)
    for mine, runners in pairs:
        # measured: bit for bit the same on this CPU; float32 rounding allowed
        np.testing.assert_allclose(mine, runners, rtol=1e-6, atol=1e-9)
    start = experiments[0].initial_state.meta_params
    moved = jax.tree.map(lambda a, b: float(np.abs(a[0] - b).max()), params, start)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the steps moved the parameters
