"""MAML's Figure 2 for a trained sinusoid run: one test task, before and after adaptation.

    python -m metalearn.tools.plot_sinusoid RUN_DIR --shots 5 --out sinusoid.png

Draws the true function, the meta-learned model's prediction before adaptation and after 1 and
10 inner steps on the support points, and the support points themselves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from metalearn.cli import OneLineParser, exit_status
from metalearn.tools import check_image_out, require_matplotlib, save_figure

require_matplotlib()  # the plot extra: one line and exit 2 without it
import matplotlib.pyplot as plt  # noqa: E402

from metalearn.algorithms.base import context  # noqa: E402
from metalearn.data.sinusoid import sample_sinusoid_task  # noqa: E402
from metalearn.runner.devices import out_of_memory_message  # noqa: E402
from metalearn.runner.saved_run import load_run  # noqa: E402


def _check_sinusoid(run_dir: str, cfg) -> None:
    if cfg.data.name != "sinusoid":
        raise ValueError(f"{run_dir} is a {cfg.data.name} run, not a sinusoid one")


def plot(
    run_dir: Path, shots: int, seed: int, steps: list[int], out: Path, fmt: str = "png"
) -> None:
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir} has no config.yaml: is it a metalearn run directory?")
    # As evaluate reads it: an empty, half-written or corrupt file is one line (a traceback).
    runner, trained = load_run(str(run_dir), "best", check=_check_sinusoid)
    cfg = runner.cfg
    meta_params, ctx = trained.meta_params, context(trained.model_state)
    runner.close()
    d = cfg.data
    key = jax.random.key(seed)
    # One task, its support points, and the true curve from the same amplitude and phase.
    task = sample_sinusoid_task(key, shots, 200, d.amplitude_range, d.phase_range, d.input_range)
    xs = jnp.linspace(*d.input_range, 200)[:, None]
    amplitude_key, phase_key, _ = jax.random.split(key, 3)
    amplitude = jax.random.uniform(
        amplitude_key, (), minval=d.amplitude_range[0], maxval=d.amplitude_range[1]
    )
    phase = jax.random.uniform(phase_key, (), minval=d.phase_range[0], maxval=d.phase_range[1])
    model, learner = runner.exp.model, runner.exp.learner
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs[:, 0], amplitude * jnp.sin(xs[:, 0] - phase), "r", label="ground truth")
    labels = {
        0: "pre-update",
        steps[0]: f"{steps[0]} grad step",
        steps[1]: f"{steps[1]} grad steps",
    }
    for num_steps, style in zip([0, *steps], [":", "--", "-"], strict=True):
        params = (
            learner.adapt(meta_params, task.support, ctx, num_steps)
            if num_steps
            else initial_model_params(meta_params)
        )
        outputs, _ = model.apply(params, ctx.model_state, None, xs, False)
        ax.plot(xs[:, 0], outputs[:, 0], style, label=labels[num_steps])
    ax.plot(
        task.support[0][:, 0], task.support[1][:, 0], "^", color="purple", label="used for grad"
    )
    ax.set(title=f"MAML, K={shots}", xlim=d.input_range)
    ax.legend(fontsize=8)
    save_figure(fig, out, fmt, dpi=120)


def initial_model_params(meta_params):
    """The meta-learned initialisation: the meta-parameters themselves, or their ``"params"``
    entry for algorithms that meta-learn more (Meta-SGD's rates, MAML++'s per-step values)."""
    if isinstance(meta_params, dict) and "params" in meta_params:
        return meta_params["params"]
    return meta_params


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m metalearn.tools.plot_sinusoid", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--shots", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, nargs=2, default=[1, 10])
    parser.add_argument("--out", type=Path, default=Path("sinusoid.png"))
    args = parser.parse_args(argv)

    def work() -> None:
        if args.shots < 1:
            raise ValueError(f"--shots must be >= 1 (support points), got {args.shots}")
        if min(args.steps) < 1 or args.steps[0] == args.steps[1]:  # one legend entry for both
            raise ValueError(
                "--steps must be two different integers >= 1, got " + " ".join(map(str, args.steps))
            )
        fmt = check_image_out(args.out, "--out", "sinusoid.png")  # before loading the model
        try:
            plot(args.run_dir, args.shots, args.seed, args.steps, args.out, fmt)
        except Exception as err:  # XLA's out of memory, e.g. --shots 100000000: a traceback
            message = out_of_memory_message(err, "lower --shots (support points)")
            if message is None:
                raise
            raise ValueError(message) from None
        print(f"wrote {args.out}")

    return exit_status(work)


if __name__ == "__main__":
    sys.exit(main())
