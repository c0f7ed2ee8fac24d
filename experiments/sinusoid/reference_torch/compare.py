"""metalearn's sinusoid seeds beside the independent PyTorch MAML's, against the paper's values.

Reads ``../seed_N/eval.json`` (metalearn, 10 query points per test task) and ``seed_N.json``
here (``scripts/reference_sinusoid_torch.py``: ``test_queries_10``, the same protocol), and
prints, for 5 shots after 1 / 5 / 10 steps: every seed's mean ± 95% CI, how many seeds' intervals
hold the paper's value, the spread between seeds against the test sampling error, and a
permutation test of the two implementations' seed means.

    python experiments/sinusoid/reference_torch/compare.py
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PAPER = {1: 0.67, 5: 0.38, 10: 0.35}  # Finn et al. 2017, 5 shots, after 1 / 5 / 10 steps


def metalearn_seeds() -> dict[int, dict[int, tuple[float, float]]]:
    out = {}
    for path in sorted(HERE.parent.glob("seed_*/eval.json")):
        rows = json.loads(path.read_text())
        cells = {r["steps"]: (r["mean"], r["ci95"]) for r in rows if r["shots"] == 5}
        out[int(path.parent.name.split("_")[1])] = {s: cells[s] for s in PAPER}
    return out


def torch_seeds() -> dict[int, dict[int, tuple[float, float]]]:
    out = {}
    for path in sorted(HERE.glob("seed_*.json")):
        record = json.loads(path.read_text())["test_queries_10"]
        out[int(path.stem.split("_")[1])] = {
            s: (record[f"shots=5 steps={s}"]["mean"], record[f"shots=5 steps={s}"]["ci95"])
            for s in PAPER
        }
    return out


def permutation_p(a: list[float], b: list[float], draws: int = 100_000) -> float:
    """Two-sided p-value of the difference of means under random relabelling (exact if small)."""
    pooled, observed = np.array(a + b), abs(np.mean(a) - np.mean(b))
    n = len(a)
    if len(pooled) <= 16:
        splits = itertools.combinations(range(len(pooled)), n)
        diffs = [abs(pooled[list(s)].mean() - np.delete(pooled, list(s)).mean()) for s in splits]
    else:
        rng = np.random.default_rng(0)
        perms = rng.permuted(np.tile(pooled, (draws, 1)), axis=1)
        diffs = np.abs(perms[:, :n].mean(1) - perms[:, n:].mean(1))
    return float(np.mean(np.asarray(diffs) >= observed - 1e-12))


def report(name: str, seeds: dict[int, dict[int, tuple[float, float]]]) -> None:
    print(f"\n{name}: {len(seeds)} seeds, 5 shots, 10 query points")
    print("| seed | 1 step | 5 steps | 10 steps | paper's three values inside |")
    print("| --- | --- | --- | --- | --- |")
    inside_all = 0
    for seed, cells in sorted(seeds.items()):
        inside = [abs(cells[s][0] - PAPER[s]) <= cells[s][1] for s in PAPER]
        inside_all += all(inside)
        text = " | ".join(f"{m:.3f} ± {c:.3f}" for m, c in cells.values())
        print(f"| {seed} | {text} | {sum(inside)} of 3 |")
    print(f"seeds holding all three: {inside_all} of {len(seeds)}")
    for s in PAPER:
        means = [c[s][0] for c in seeds.values()]
        half_widths = [c[s][1] for c in seeds.values()]
        inside = sum(abs(c[s][0] - PAPER[s]) <= c[s][1] for c in seeds.values())
        print(
            f"  {s:>2} steps: seed means {min(means):.3f}-{max(means):.3f}, mean "
            f"{statistics.mean(means):.3f}, median {statistics.median(means):.3f}, "
            f"SD between seeds {statistics.stdev(means):.3f} against a test-sampling SE of "
            f"{statistics.mean(half_widths) / 1.96:.3f}; paper inside on {inside} seeds"
        )


def main() -> None:
    ours, theirs = metalearn_seeds(), torch_seeds()
    report("metalearn", ours)
    report("PyTorch reference (scripts/reference_sinusoid_torch.py)", theirs)
    print("\nmetalearn vs the reference, seed means (permutation test):")
    for s in PAPER:
        a, b = [c[s][0] for c in ours.values()], [c[s][0] for c in theirs.values()]
        print(
            f"  {s:>2} steps: {statistics.mean(a):.3f} vs {statistics.mean(b):.3f}, "
            f"difference {statistics.mean(a) - statistics.mean(b):+.3f}, "
            f"p = {permutation_p(a, b):.2f}"
        )


if __name__ == "__main__":
    main()
