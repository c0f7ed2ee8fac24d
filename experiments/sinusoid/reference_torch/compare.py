"""metalearn's sinusoid seeds beside the independent PyTorch MAML's, against the paper's values.

Reads metalearn's ``../seed_N/eval_latest.json`` (the last iterate, as the reference code
tests; 10 query points per test task) and ``../seed_N/eval.json`` (the main job's record: the
parameters best on validation), and ``seed_N.json`` here (``scripts/reference_sinusoid_torch.py``,
its last iterate: ``test_queries_10``, the same protocol). Prints, for 5 shots after 1 / 5 / 10
steps: every seed's mean ± 95% CI, how many seeds' intervals hold the paper's value, the spread
between seeds against the test sampling error, and a permutation test of the seed means.

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


# seed -> steps -> (mean, 95% half-width, tasks diverged of 600)
Seeds = dict[int, dict[int, tuple[float, float, int]]]


def metalearn_seeds(record: str) -> Seeds:
    out = {}
    for path in sorted(HERE.parent.glob(f"seed_*/{record}")):
        rows = json.loads(path.read_text())
        cells = {r["steps"]: (r["mean"], r["ci95"], r["diverged"]) for r in rows if r["shots"] == 5}
        out[int(path.parent.name.split("_")[1])] = {s: cells[s] for s in PAPER}
    return out


def torch_seeds() -> Seeds:
    out = {}
    for path in sorted(HERE.glob("seed_*.json")):
        record = json.loads(path.read_text())["test_queries_10"]
        cells = [record[f"shots=5 steps={s}"] for s in PAPER]
        out[int(path.stem.split("_")[1])] = {
            s: (c["mean"], c["ci95"], c["diverged"]) for s, c in zip(PAPER, cells, strict=True)
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


def report(name: str, seeds: Seeds) -> None:
    print(f"\n{name}: {len(seeds)} seeds, 5 shots, 10 query points")
    print("| seed | 1 step | 5 steps | 10 steps | paper's values inside | diverged (10 steps) |")
    print("| --- | --- | --- | --- | --- | --- |")
    inside_all = 0
    for seed, cells in sorted(seeds.items()):
        inside = [abs(cells[s][0] - PAPER[s]) <= cells[s][1] for s in PAPER]
        inside_all += all(inside)
        text = " | ".join(f"{m:.3f} ± {c:.3f}" for m, c, _ in cells.values())
        print(f"| {seed} | {text} | {sum(inside)} of 3 | {cells[10][2]} |")
    diverged = sum(c[10][2] > 0 for c in seeds.values())
    print(
        f"seeds holding all three: {inside_all} of {len(seeds)}; "
        f"seeds with a task diverged after 10 steps: {diverged}"
    )
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


def compare(name: str, ours: dict, theirs: dict) -> None:
    print(f"\n{name} vs the reference, seed means and medians (permutation test of the means):")
    for s in PAPER:
        a, b = [c[s][0] for c in ours.values()], [c[s][0] for c in theirs.values()]
        print(
            f"  {s:>2} steps: {statistics.mean(a):.3f} vs {statistics.mean(b):.3f} "
            f"(medians {statistics.median(a):.3f} vs {statistics.median(b):.3f}), "
            f"difference {statistics.mean(a) - statistics.mean(b):+.3f}, "
            f"p = {permutation_p(a, b):.2f}"
        )


def main() -> None:
    latest, best, theirs = (
        metalearn_seeds("eval_latest.json"),
        metalearn_seeds("eval.json"),
        torch_seeds(),
    )
    report("metalearn, last iterate", latest)
    report("metalearn, main job (best on validation)", best)
    report("PyTorch reference (scripts/reference_sinusoid_torch.py), last iterate", theirs)
    compare("metalearn last iterate", latest, theirs)
    compare("metalearn main job", best, theirs)


if __name__ == "__main__":
    main()
