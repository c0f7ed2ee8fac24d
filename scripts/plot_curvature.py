"""Plot the curves written by scripts/sinusoid_curvature.py: top eigenvalue x alpha / 2.

    python scripts/plot_curvature.py A.json B.json ... --labels a b ... --out curvature.png

Left and middle: the median (solid) and 90th percentile (dashed) over tasks of the top Hessian
eigenvalue of the support loss at the meta-parameters and after one inner step, in units of
2 / alpha (above 1: plain gradient descent at alpha is unstable along that direction). Right:
the share of tasks that diverged after the inner steps.
"""

from __future__ import annotations

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(paths: list[str], labels: list[str], out: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for path, label in zip(paths, labels, strict=True):
        with open(path) as f:
            rows = json.load(f)["rows"]
        steps = [r["step"] for r in rows]
        color = None
        for ax, name in zip(axes[:2], ("lam0", "lam1"), strict=True):
            if f"{name}_median" not in rows[0]:
                continue
            median = [r[f"{name}_median"] / r["two_over_alpha"] for r in rows]
            p90 = [r[f"{name}_p90"] / r["two_over_alpha"] for r in rows]
            (line,) = ax.plot(steps, median, label=label, color=color)
            color = line.get_color()
            ax.plot(steps, p90, "--", color=color)
        axes[2].plot(
            steps, [100 * r["diverged"] / r["tasks"] for r in rows], "o-", label=label, color=color
        )
    titles = ("at the meta-learned parameters", "after one inner step")
    for ax, title in zip(axes[:2], titles, strict=True):
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xlabel="meta-step", ylabel="top eigenvalue / (2 / alpha)", title=title)
        ax.legend(fontsize=8)
    axes[2].set(xlabel="meta-step", ylabel="% of tasks diverged after 10 steps", title="divergence")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--labels", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if len(args.labels) != len(args.paths):
        sys.exit("error: give one --labels entry per JSON file")
    plot(args.paths, args.labels, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
