"""An independent PyTorch MAML for sinusoid regression, written from cbfinn/maml's settings.

It shares nothing with metalearn but the settings, so that its runs over many seeds tell how
much of the spread between metalearn's seeds belongs to the algorithm itself; only its count of
blown-up test tasks is metalearn's own rule (``diverged_mask``), so that both count alike.
Everything follows the paper's reference code (cbfinn/maml, commit a7f45f1):

- tasks (data_generator.py): amplitude U[0.1, 5], phase U[0, pi], x U[-5, 5]; each task draws
  2K points, the first K its support set, the last K its query set (K = 10 in training);
- network (maml.py, ``construct_fc_weights``): 1-40-40-1 with ReLU, weights from
  ``tf.truncated_normal(stddev=0.01)`` (redrawn beyond two standard deviations), zero biases;
- inner loop: one SGD step of ``update_lr`` = 0.001 (main.py's flag default, which the documented
  sinusoid command keeps) on the mean squared error of the support set, second order;
- outer loop: the mean over a meta-batch of 25 tasks of the query MSE, Adam at 1e-3, 70,000
  iterations; the last iterate is tested;
- test: 600 tasks of K support points (5, 10, 20) and Q query points (the reference draws Q = K;
  metalearn's main table uses Q = 10), MSE after 0, 1, 5 and 10 steps at the training step size,
  mean ± 1.96 std / sqrt(600).

The tasks of a meta-batch are batched by hand (each weight expanded to one copy per task, so that
one backward pass gives every task its own inner gradient); float32, on the CPU.

Usage::

    python scripts/reference_sinusoid_torch.py --seed 0 --json out/seed_0.json
    python scripts/reference_sinusoid_torch.py --seed 0 --steps 200 --json /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from metalearn.statistics import diverged_mask

AMPLITUDE, PHASE, INPUT = (0.1, 5.0), (0.0, math.pi), (-5.0, 5.0)
HIDDEN = (40, 40)
INIT_STD = 0.01
INNER_LR = 1e-3
META_LR = 1e-3
META_BATCH = 25
TRAIN_SHOTS = 10
TEST_TASKS = 600
TEST_SHOTS = (5, 10, 20)
TEST_STEPS = (0, 1, 5, 10)


def sample_tasks(
    rng: np.random.Generator, tasks: int, support: int, query: int
) -> tuple[torch.Tensor, ...]:
    """``tasks`` sinusoids, each with ``support`` + ``query`` points: (xs, ys, xq, yq)."""
    amplitude = rng.uniform(*AMPLITUDE, size=(tasks, 1, 1))
    phase = rng.uniform(*PHASE, size=(tasks, 1, 1))
    x = rng.uniform(*INPUT, size=(tasks, support + query, 1))
    y = amplitude * np.sin(x - phase)
    x, y = (torch.tensor(a, dtype=torch.float32) for a in (x, y))
    return x[:, :support], y[:, :support], x[:, support:], y[:, support:]


def truncated_normal(shape: tuple[int, ...], std: float, gen: torch.Generator) -> torch.Tensor:
    """``tf.truncated_normal``: a normal, redrawn wherever it is beyond two standard deviations."""
    out = torch.randn(shape, generator=gen)
    while (outside := out.abs() > 2).any():
        out[outside] = torch.randn(int(outside.sum()), generator=gen)
    return out * std


def init_params(gen: torch.Generator) -> list[torch.Tensor]:
    """[W1, b1, W2, b2, W3, b3], W of shape (in, out), as the reference's weight dictionary."""
    sizes = (1, *HIDDEN, 1)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        params.append(truncated_normal((fan_in, fan_out), INIT_STD, gen).requires_grad_())
        params.append(torch.zeros(fan_out, requires_grad=True))
    return params


def forward(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The MLP on x (tasks, points, 1); each parameter shared, or one copy per task (leading T)."""
    h = x
    layers = len(params) // 2
    for i in range(layers):
        weight, bias = params[2 * i], params[2 * i + 1]
        h = torch.matmul(h, weight) + bias.unsqueeze(-2)
        if i < layers - 1:
            h = torch.relu(h)
    return h


def task_mse(params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each task's mean squared error: shape (tasks,)."""
    return ((forward(params, x) - y) ** 2).mean(dim=(1, 2))


def per_task(params: list[torch.Tensor], tasks: int) -> list[torch.Tensor]:
    """One copy of every parameter per task (a view that keeps the graph to the shared ones)."""
    return [p.unsqueeze(0).expand(tasks, *p.shape) for p in params]


def adapt(
    params: list[torch.Tensor], xs: torch.Tensor, ys: torch.Tensor, steps: int, create_graph: bool
) -> list[list[torch.Tensor]]:
    """Per-task parameters after 0..steps SGD steps of INNER_LR on each task's support MSE."""
    fast = per_task(params, xs.shape[0])
    trajectory = [fast]
    for _ in range(steps):
        # The tasks' losses depend on disjoint slices of ``fast``: the gradient of their sum
        # is every task's own gradient.
        grads = torch.autograd.grad(task_mse(fast, xs, ys).sum(), fast, create_graph=create_graph)
        fast = [p - INNER_LR * g for p, g in zip(fast, grads, strict=True)]
        trajectory.append(fast)
    return trajectory


def meta_loss(params: list[torch.Tensor], batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The reference's ``total_losses2[-1]``: the mean over tasks of the post-update query MSE."""
    xs, ys, xq, yq = batch
    adapted = adapt(params, xs, ys, 1, create_graph=True)[-1]
    return task_mse(adapted, xq, yq).mean()


def evaluate(params: list[torch.Tensor], seed: int, queries: int | None) -> dict[str, dict]:
    """MSE after TEST_STEPS steps on TEST_TASKS tasks per shot count (Q = K if queries is None)."""
    results: dict[str, dict] = {}
    for shots in TEST_SHOTS:
        rng = np.random.default_rng([seed, 1, shots])  # tasks never drawn in training
        xs, ys, xq, yq = sample_tasks(rng, TEST_TASKS, shots, queries or shots)
        trajectory = adapt(params, xs, ys, max(TEST_STEPS), create_graph=False)
        with torch.no_grad():
            mses = {
                s: task_mse(trajectory[s], xq, yq).numpy().astype(np.float64) for s in TEST_STEPS
            }
        for steps, mse in mses.items():
            # the rule of metalearn's eval.json, against each task's MSE before adaptation
            blown = diverged_mask(mse, mses[0])
            results[f"shots={shots} steps={steps}"] = {
                "mean": float(mse.mean()),
                "ci95": float(1.96 * mse.std() / math.sqrt(len(mse))),  # the reference's ddof 0
                "median": float(np.median(mse)),
                "max": float(mse.max()),
                "nonfinite": int((~np.isfinite(mse)).sum()),
                "diverged": int(blown.sum()),
            }
    return results


def train(seed: int, steps: int, log_every: int) -> tuple[list[torch.Tensor], list[dict]]:
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng([seed, 0])
    params = init_params(gen)
    optimizer = torch.optim.Adam(params, lr=META_LR)
    curve = []
    for step in range(1, steps + 1):
        loss = meta_loss(params, sample_tasks(rng, META_BATCH, TRAIN_SHOTS, TRAIN_SHOTS))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % log_every == 0 or step == steps:
            curve.append({"step": step, "post_update_query_mse": loss.item()})
            print(f"step {step}: post-update query MSE {loss.item():.4f}", flush=True)
    return params, curve


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give 1 or more")
    return value


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=70_000, help="meta-iterations")
    parser.add_argument("--log-every", type=_at_least_one, default=5_000)
    parser.add_argument("--threads", type=_at_least_one, default=1, help="torch intra-op threads")
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    params, curve = train(args.seed, args.steps, args.log_every)
    train_seconds = time.perf_counter() - start
    record = {
        "implementation": "scripts/reference_sinusoid_torch.py (PyTorch, independent of metalearn)",
        "torch": torch.__version__,
        "seed": args.seed,
        "meta_steps": args.steps,
        "train_seconds": round(train_seconds, 1),
        "test_queries_10": evaluate(params, args.seed, queries=10),
        "test_queries_k": evaluate(params, args.seed, queries=None),
        "curve": curve,
        # The last iterate, [W1, b1, W2, b2, W3, b3] with W of shape (in, out), to test again.
        "params": [p.detach().tolist() for p in params],
    }
    for name in ("test_queries_10", "test_queries_k"):
        row = record[name]
        cells = [f"{row[f'shots=5 steps={s}']['mean']:.3f}" for s in (1, 5, 10)]
        print(f"{name}: 5 shots after 1 / 5 / 10 steps: {' / '.join(cells)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
