"""Smoke tests of scripts/bench.py (the metalearn vs higher meta-step benchmark)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import checkout_env, finished
from tests.scripts import peer_checks

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
FIELDS = {
    "case", "impl", "device", "ms_per_step", "compile_s", "peak_mem_mb", "peak_mem_kind",
    "inner_steps", "order", "meta_batch", "ways", "shots", "batching",
}  # fmt: skip
HAVE_HIGHER = all(importlib.util.find_spec(m) for m in ("torch", "higher"))
NO_HIGHER = "torch and higher are an optional extra: pip install torch, then -e '.[bench]'"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench

    return bench


def run_sinusoid(bench, tmp_path, impl: str, *extra: str) -> list[dict]:
    out = tmp_path / "bench.jsonl"
    argv = ["--case", "sinusoid", "--impl", impl, "--steps", "2", "--warmup", "1"]
    argv += ["--compile-cache"]  # the suite's persistent cache (tests/conftest.py)
    bench.main([*argv, "--json", str(out), "--no-isolate", *extra])
    return [json.loads(line) for line in out.read_text().splitlines()]


def check_row(row: dict, impl: str) -> None:
    assert set(row) >= FIELDS, FIELDS - set(row)
    assert row["case"] == "sinusoid" and row["impl"] == impl
    assert (row["inner_steps"], row["order"], row["meta_batch"], row["shots"]) == (
        1,
        "second",
        25,
        10,
    )
    assert row["ms_per_step"] > 0 and row["compile_s"] >= 0
    # The growth of this process's peak RSS is zero where an earlier test in it peaked higher
    # (these rows run in the test's process); every other memory kind is measured for the row.
    assert (
        row["peak_mem_mb"] >= 0
        if row["peak_mem_kind"] == "rss_peak_delta"
        else row["peak_mem_mb"] > 0
    )


def test_metalearn_sinusoid_rows(bench, tmp_path, capsys):
    rows = run_sinusoid(bench, tmp_path, "metalearn")
    assert len(rows) == 1
    check_row(rows[0], "metalearn")
    assert rows[0]["batching"] == "vmap"  # what the runner picks for an MLP
    assert rows[0]["peak_mem_kind"] in ("xla_memory_analysis", "device_peak_bytes_in_use")
    assert "sinusoid" in capsys.readouterr().out  # the table


def test_count_flops_fills_in_rows_a_backend_left_without_a_count(bench, tmp_path):
    """XLA:GPU gave no FLOP count for its rows; ``--count-flops`` counts the same step here. The
    count must be the one the timed run took for the same spec, and a sane multiple of the
    forward passes' arithmetic."""
    (row,) = run_sinusoid(bench, tmp_path, "metalearn")
    counted_when_timed = row.pop("gflop_per_step")
    row.pop("gflop_s")
    peer = dict(row, impl="higher")
    path = tmp_path / "gpu.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(peer) + "\n")
    bench.main(["--count-flops", str(path)])
    filled, untouched = (json.loads(line) for line in path.read_text().splitlines())
    assert filled["gflop_per_step"] == pytest.approx(counted_when_timed, rel=1e-6)
    assert filled["gflop_s"] == pytest.approx(filled["gflop_per_step"] / (row["ms_per_step"] / 1e3))
    assert filled["gflop_counted_on"] == "cpu"
    assert untouched == peer
    # MLP 1-40-40-1: 2 x (40 + 40 x 40 + 40) FLOPs per point forward; 25 tasks x 20 points,
    # before and after the inner step; the backward passes add a few times that
    forward = 2 * (40 + 40 * 40 + 40) * 25 * 20 * 2 / 1e9
    assert forward < filled["gflop_per_step"] < 20 * forward


def test_a_rolled_inner_loop_is_counted_as_the_unrolled_one(bench):
    """XLA counts a rolled loop's body once: 20 rolled inner steps were counted as one step's
    arithmetic (0.0106 GFLOP against 0.1617 unrolled)."""
    from bench_jax import step_gflop

    argv = ["--case", "sinusoid", "--impl", "metalearn", "--inner-steps", "20"]
    flops = {}
    for unroll in ("full", "1"):
        (spec,) = bench.make_specs(bench.parse_args([*argv, "--inner-unroll", unroll]))
        flops[unroll] = step_gflop(spec)
    (one_step,) = bench.make_specs(bench.parse_args([*argv[:-1], "1"]))
    assert flops["1"] == pytest.approx(flops["full"], rel=1e-6)
    assert flops["full"] > 10 * step_gflop(one_step)


@pytest.mark.skipif(not HAVE_HIGHER, reason=NO_HIGHER)
def test_higher_sinusoid_rows(bench, tmp_path):
    rows = run_sinusoid(bench, tmp_path, "higher", "--torch-threads", "1")
    assert len(rows) == 1
    check_row(rows[0], "higher")
    assert rows[0]["batching"] == "loop"
    assert rows[0]["peak_mem_kind"] in (
        "rss_peak_delta",
        "cuda_max_memory_allocated_minus_baseline",
    )


HIGHER_CHECKS = [check for check in peer_checks.CHECKS if check[2] == 1]


@pytest.mark.skipif(not HAVE_HIGHER, reason=NO_HIGHER)
@pytest.mark.parametrize(("case", "order", "inner_steps"), HIGHER_CHECKS)
def test_higher_meta_gradient_equals_metalearns(bench, case, order, inner_steps):
    """higher's step takes metalearn's meta-step: the gradient in ``.grad`` when its Adam steps
    equals metalearn's in float64 on the same weights and tasks (tests/scripts/peer_checks)."""
    import torch
    import torch.nn.functional as F
    from bench_higher import TorchConv4, make_step, sinusoid_mlp

    spec = peer_checks.spec_for(bench, case, order, inner_steps, meta_batch=4)
    weights, batch = problem = peer_checks.random_problem(spec)
    torch.set_num_threads(1)
    if spec["kind"] == "sinusoid":
        model, loss_fn = sinusoid_mlp().double(), F.mse_loss
    else:
        model, loss_fn = TorchConv4(spec["ways"], padding="same").double(), F.cross_entropy
    params = list(model.parameters())
    with torch.no_grad():
        for p, w in zip(params, weights, strict=True):
            p.copy_(torch.from_numpy(w))
            p.grad = torch.zeros_like(p)
    data = {k: torch.from_numpy(v) for k, v in batch.items()}
    make_step(spec, model, lambda: ((data["xs"], data["ys"]), (data["xq"], data["yq"])), loss_fn)()
    mine = [p.grad.numpy() for p in params]
    reference = peer_checks.metalearn_meta_gradient(spec, problem)
    assert peer_checks.max_relative_difference(mine, reference) < 1e-8


def test_specs_cover_the_grid(bench):
    args = bench.parse_args(["--case", "omniglot_5w1s", "--impl", "metalearn,higher"])
    specs = bench.make_specs(args)
    grid = {(s["impl"], s["inner_steps"], s["order"]) for s in specs}
    assert grid == {
        (impl, k, order)
        for impl in ("metalearn", "higher")
        for k in (1, 5)
        for order in ("second", "first")
    }
    assert all(s["meta_batch"] == 32 and s["queries"] == 15 for s in specs)


def test_remat_sweep_specs(bench):
    specs = bench.make_specs(bench.parse_args(["--case", "omniglot_5w1s", "--remat-sweep"]))
    assert {(s["inner_steps"], s["remat"]) for s in specs} == {
        (k, remat) for k in (1, 5, 10, 20) for remat in (False, True)
    }
    assert {s["impl"] for s in specs} == {"metalearn"}


def test_table_ratio(bench):
    base = {"case": "c", "inner_steps": 1, "order": "second", "remat": False, "load_1m": 1.0}
    rows = [
        {**base, "impl": "metalearn", "batching": "vmap", "ms_per_step": 2.0, "compile_s": 1.0},
        {**base, "impl": "higher", "batching": "loop", "ms_per_step": 10.0, "compile_s": 0.0},
    ]
    out = io.StringIO()
    bench.print_table(rows, out)
    assert " 5.00 " in out.getvalue()


def test_unknown_case_is_an_error(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--case", "omniglot_3w1s"])
    assert exit_info.value.code == 2
    assert "unknown case 'omniglot_3w1s'; known: omniglot_5w1s" in capsys.readouterr().err


@pytest.mark.slow
def test_command_line_isolated(tmp_path):
    out = tmp_path / "bench.jsonl"
    impls = "metalearn,higher" if HAVE_HIGHER else "metalearn"
    cmd = [sys.executable, str(SCRIPTS / "bench.py"), "--case", "sinusoid", "--impl", impls]
    cmd += ["--steps", "2", "--warmup", "1", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["impl"] for r in rows] == impls.split(",")
    for row in rows:
        check_row(row, row["impl"])


SAME_BITS = """
import jax, numpy as np
from bench_jax import unroll_cpu_threefry
def draws(key):
    a, b = jax.random.split(jax.random.fold_in(key, 7))
    return jax.random.uniform(a, (1000,)), jax.random.normal(b, (5, 7)), jax.random.bits(b, (9,))
key = jax.random.key(3)
rolled = jax.jit(lambda k: draws(k))
assert " while" in rolled.lower(key).compile().as_text()
before = jax.device_get(rolled(key))
assert unroll_cpu_threefry()
unrolled = jax.jit(lambda k: draws(k))
assert " while" not in unrolled.lower(key).compile().as_text()
after = jax.device_get(unrolled(key))
for x, y in zip(before, after, strict=True):
    np.testing.assert_array_equal(x, y)
print("same bits")
"""


def test_unrolled_threefry_draws_the_same_bits_without_a_loop():
    result = finished([sys.executable, "-c", SAME_BITS], 300, cwd=SCRIPTS, env=checkout_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "same bits" in result.stdout
