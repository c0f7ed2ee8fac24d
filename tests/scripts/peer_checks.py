"""The float64 meta-gradient checks the PyTorch peers of scripts/bench.py share: one problem
(weights far from their initialisation and a task batch, as NumPy arrays in the PyTorch
networks' parameter order and layout) and metalearn's meta-gradient on it.

metalearn's side is the benchmark's own: ``bench_jax.build_parts`` (the registered Conv4 or MLP
and MAML with the case's rate, steps and order), each task's ``learner.task_grad`` and their
mean, as the runner's meta-step takes it before the optimiser; in float64.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Problem = tuple[list[np.ndarray], dict[str, np.ndarray]]


# (case, order, inner steps) of the float64 checks of every peer
CHECKS = [
    ("sinusoid", "second", 1),
    ("sinusoid", "first", 1),
    ("omniglot_5w1s", "second", 1),
    ("omniglot_5w1s", "first", 1),
    ("omniglot_5w1s", "second", 5),
]


def spec_for(bench, case: str, order: str, inner_steps: int, meta_batch: int) -> dict[str, Any]:
    """The spec ``bench.py`` would time for this configuration (metalearn's side of it)."""
    argv = ["--case", case, "--impl", "metalearn", "--order", order]
    argv += ["--inner-steps", str(inner_steps), "--meta-batch", str(meta_batch)]
    (spec,) = bench.make_specs(bench.parse_args(argv))
    return spec


def random_problem(spec: dict[str, Any], seed: int = 0) -> Problem:
    """Weights (PyTorch order: ``TorchConv4``'s convs, scales, biases, head; or
    ``sinusoid_mlp``'s layers) and one meta-batch (NCHW images), float64. The weights are far
    from the initial ones (batch-norm scales and offsets, head, biases all random) so that
    every parameter and both orders matter."""
    rng = np.random.default_rng(seed)
    mb = spec["meta_batch"]
    if spec["kind"] == "sinusoid":
        shapes = [(40, 1), (40,), (40, 40), (40,), (1, 40), (1,)]
        weights = [rng.normal(0.0, 0.5, s) for s in shapes]
        amp = rng.uniform(0.1, 5.0, (mb, 1, 1))
        phase = rng.uniform(0.0, np.pi, (mb, 1, 1))
        x = rng.uniform(-5.0, 5.0, (mb, spec["shots"] + spec["queries"], 1))
        y = amp * np.sin(x - phase)
        k = spec["shots"]
        return weights, {"xs": x[:, :k], "ys": y[:, :k], "xq": x[:, k:], "yq": y[:, k:]}
    ways, filters = spec["ways"], 64
    convs, convs_bias = [], []
    for i in range(4):
        fan_in = 9 * (1 if i == 0 else filters)
        convs.append(rng.normal(0.0, (2.0 / fan_in) ** 0.5, (filters, fan_in // 9, 3, 3)))
        convs_bias.append(rng.normal(0.0, 0.1, filters))
    weights = [w for pair in zip(convs, convs_bias, strict=True) for w in pair]
    weights += [rng.normal(1.0, 0.2, filters) for _ in range(4)]  # batch-norm scales
    weights += [rng.normal(0.0, 0.2, filters) for _ in range(4)]  # batch-norm offsets
    weights += [rng.normal(0.0, 0.5, (ways, filters)), rng.normal(0.0, 0.1, ways)]

    def labels(per_class: int) -> np.ndarray:
        return np.stack([np.repeat(rng.permutation(ways), per_class) for _ in range(mb)])

    def images(n: int) -> np.ndarray:
        return rng.integers(0, 256, (mb, n, 1, 28, 28)).astype(np.float64) / 255.0

    batch = {"xs": images(ways * spec["shots"]), "ys": labels(spec["shots"])}
    batch.update(xq=images(ways * spec["queries"]), yq=labels(spec["queries"]))
    return weights, batch


def to_flax(spec: dict[str, Any], weights: list[np.ndarray]) -> dict:
    """The PyTorch-ordered weights as metalearn's parameters (kernels HWIO / [in, out])."""
    if spec["kind"] == "sinusoid":
        names = ("hidden_0", "hidden_1", "head")
        return {
            name: {"kernel": weights[2 * i].T, "bias": weights[2 * i + 1]}
            for i, name in enumerate(names)
        }
    params = {
        f"convs_{i}": {"kernel": weights[2 * i].transpose(2, 3, 1, 0), "bias": weights[2 * i + 1]}
        for i in range(4)
    }
    for i in range(4):
        params[f"norms_{i}"] = {"scale": weights[8 + i], "bias": weights[12 + i]}
    params["head"] = {"kernel": weights[16].T, "bias": weights[17]}
    return params


def from_flax(spec: dict[str, Any], params: dict) -> list[np.ndarray]:
    """:func:`to_flax`'s inverse (for gradients)."""
    p = jax.tree_util.tree_map(np.asarray, params)
    if spec["kind"] == "sinusoid":
        return [
            a for n in ("hidden_0", "hidden_1", "head") for a in (p[n]["kernel"].T, p[n]["bias"])
        ]
    out = []
    for i in range(4):
        out += [p[f"convs_{i}"]["kernel"].transpose(3, 2, 0, 1), p[f"convs_{i}"]["bias"]]
    out += [p[f"norms_{i}"]["scale"] for i in range(4)]
    out += [p[f"norms_{i}"]["bias"] for i in range(4)]
    return out + [p["head"]["kernel"].T, p["head"]["bias"]]


def metalearn_meta_gradient(spec: dict[str, Any], problem: Problem) -> list[np.ndarray]:
    """metalearn's mean meta-gradient over the batch, float64, in PyTorch order and layout."""
    from bench_jax import build_parts

    from metalearn.algorithms.base import context
    from metalearn.data.task import Task

    weights, batch = problem
    with jax.enable_x64(True):
        _, model, learner = build_parts(spec)
        _, state = model.init(jax.random.key(0))
        params = jax.tree_util.tree_map(jnp.asarray, to_flax(spec, weights))
        data = {k: jnp.asarray(v) for k, v in batch.items()}
        if spec["kind"] != "sinusoid":  # NCHW -> NHWC, integer labels
            data = {k: v.transpose(0, 1, 3, 4, 2) if k[0] == "x" else v for k, v in data.items()}
            data.update(ys=data["ys"].astype(jnp.int32), yq=data["yq"].astype(jnp.int32))

        def one(params, xs, ys, xq, yq):
            task = Task(support=(xs, ys), query=(xq, yq))
            return learner.task_grad(params, task, context(state))[0]

        @jax.jit  # one program, not the meta-gradient op by op
        def mean_gradient(params, data):
            each = jax.vmap(one, in_axes=(None, 0, 0, 0, 0))
            grads = each(params, data["xs"], data["ys"], data["xq"], data["yq"])
            return jax.tree_util.tree_map(lambda g: g.mean(0), grads)

        mean = mean_gradient(params, data)
        assert all(g.dtype == jnp.float64 for g in jax.tree_util.tree_leaves(mean))
        return from_flax(spec, mean)


def max_relative_difference(mine: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """max |mine - reference| over every entry, over max |reference|: the whole gradient's
    scale (the convolutions' biases have an exactly zero gradient under batch norm)."""
    a = np.concatenate([np.ravel(x) for x in mine])
    b = np.concatenate([np.ravel(x) for x in reference])
    assert a.shape == b.shape
    return float(np.abs(a - b).max() / np.abs(b).max())
