"""scripts/bench.py's torch.func peers (``--impl torchfunc``, ``torchfunc_compile``).

A time is only evidence about metalearn if the peer takes the same meta-step: its meta-gradient
(what lies in ``.grad`` when its Adam steps) must equal metalearn's in float64 on the same
weights and tasks, for the sinusoid MLP and Conv4 (5-way 1-shot), both orders.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tests.scripts import peer_checks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is an optional extra: pip install torch==2.13.0 (CPU build), then -e '.[bench]'",
)
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
RTOL = 1e-8  # float64 on both sides: rounding only (measured: about 1e-14)


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench

    return bench


def torchfunc_meta_gradient(spec, problem, *, compile: bool) -> list[np.ndarray]:
    """The gradient one ``bench_torchfunc`` meta-step leaves in ``.grad`` (float64)."""
    import torch
    import torch.nn.functional as F
    from bench_torch import TorchConv4, sinusoid_mlp
    from bench_torchfunc import make_step

    weights, batch = problem
    torch.set_num_threads(1)
    if spec["kind"] == "sinusoid":
        model, loss_fn = sinusoid_mlp().double(), F.mse_loss
    else:
        model = TorchConv4(spec["ways"], padding="same", norm="explicit").double()
        loss_fn = F.cross_entropy
    params = list(model.parameters())
    with torch.no_grad():
        for p, w in zip(params, weights, strict=True):
            p.copy_(torch.from_numpy(w))
    data = {k: torch.from_numpy(v) for k, v in batch.items()}
    sample = lambda: ((data["xs"], data["ys"]), (data["xq"], data["yq"]))  # noqa: E731
    make_step(spec, model, sample, loss_fn, compile=compile)()
    return [p.grad.numpy() for p in params]


CHECKS = peer_checks.CHECKS


# Inductor compiles a Conv4 step for one to several minutes on two cores (second order, one inner
# step: 146 s in float64; once unfinished after 27 min on a loaded machine): run with --runslow.
ALL_CHECKS = [(*check, False) for check in CHECKS] + [
    pytest.param(*check, True, marks=pytest.mark.slow) if check[0] != "sinusoid" else (*check, True)
    for check in CHECKS
]


@pytest.mark.parametrize(("case", "order", "inner_steps", "compiled"), ALL_CHECKS)
def test_meta_gradient_equals_metalearns(bench, case, order, inner_steps, compiled):
    spec = peer_checks.spec_for(bench, case, order, inner_steps, meta_batch=4)
    problem = peer_checks.random_problem(spec)
    reference = peer_checks.metalearn_meta_gradient(spec, problem)
    mine = torchfunc_meta_gradient(spec, problem, compile=compiled)
    assert peer_checks.max_relative_difference(mine, reference) < RTOL


def test_the_orders_differ_at_this_tolerance(bench):
    """The checks could not tell a first-order step from a second-order one otherwise."""
    grads = {}
    for order in ("second", "first"):
        spec = peer_checks.spec_for(bench, "omniglot_5w1s", order, 1, meta_batch=4)
        grads[order] = peer_checks.metalearn_meta_gradient(spec, peer_checks.random_problem(spec))
    gap = peer_checks.max_relative_difference(grads["first"], grads["second"])
    assert gap > 1e3 * RTOL


@pytest.mark.parametrize("impl", ["torchfunc", "torchfunc_compile"])
def test_sinusoid_rows(bench, tmp_path, impl, capsys):
    out = tmp_path / "bench.jsonl"
    argv = ["--case", "sinusoid", "--impl", impl, "--steps", "2", "--warmup", "1"]
    bench.main([*argv, "--torch-threads", "1", "--json", str(out), "--no-isolate"])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["case"], row["impl"], row["batching"]) == ("sinusoid", impl, "vmap")
    assert (row["inner_steps"], row["order"], row["meta_batch"]) == (1, "second", 25)
    assert row["ms_per_step"] > 0 and row["peak_mem_mb"] >= 0 and "unsupported" not in row
    assert row["peak_mem_kind"] in ("rss_peak_delta", "cuda_max_memory_allocated_minus_baseline")
    if impl == "torchfunc_compile":  # one graph, the whole meta-loss: nothing ran eagerly
        assert row["compile_s"] > 0 and (row["compile_graphs"], row["graph_breaks"]) == (1, 0)
    assert impl in capsys.readouterr().out  # the table


def test_an_unsupported_row_is_printed_as_such(bench, capsys):
    rows = [
        {"case": "c", "impl": "torchfunc_compile", "inner_steps": 1, "order": "second",
         "batching": "vmap", "remat": False, "unsupported": "torch.compile: no double backward"},
    ]  # fmt: skip
    bench.print_table(rows)
    assert "UNSUPPORTED torch.compile: no double backward" in capsys.readouterr().out
    assert "| torch.compile: no double backward |" in bench.markdown_table(rows)
