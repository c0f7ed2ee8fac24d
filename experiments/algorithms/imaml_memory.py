"""iMAML's memory does not grow with the number of inner steps; MAML's does.

    python experiments/algorithms/imaml_memory.py

Compiles ``task_grad`` for 5, 50 and 500 inner steps and prints XLA's ``memory_analysis()`` of
each executable: temporary (scratch) bytes, the memory that holds intermediates. For MAML the
inner loop is a rolled ``lax.scan`` (``unroll=1``; unrolled, compile time grows with the steps
and reverse mode keeps the same per-step residuals) and backpropagation keeps every step's
residuals; iMAML runs its inner loop without differentiating it and gets the meta-gradient from
a fixed number of CG iterations at the solution. Models: the sinusoid MLP (50 support points)
and Conv4 on an Omniglot-shaped 5-way 1-shot task.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from metalearn.algorithms.base import context, inner_loss
from metalearn.algorithms.imaml import imaml
from metalearn.core import maml_loss
from metalearn.data.sinusoid import sample_sinusoid_task
from metalearn.data.task import Task, supervised_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP

STEPS = (5, 50, 500)


def problems():
    mlp = supervised_objective(
        model_from_flax(MLP((40, 40), 1), (1,), ModelParts(head="head")), "regression"
    )
    yield "MLP 1-40-40-1, sinusoid K=50", mlp, sample_sinusoid_task(jax.random.key(0), 50, 10)
    from metalearn.models.conv4 import CONV4_PARTS, Conv4

    conv = supervised_objective(
        model_from_flax(Conv4(5), (28, 28, 1), CONV4_PARTS), "classification"
    )
    keys = jax.random.split(jax.random.key(1), 2)
    labels = jnp.arange(5)
    task = Task(
        (jax.random.uniform(keys[0], (5, 28, 28, 1)), labels),
        (jax.random.uniform(keys[1], (75, 28, 28, 1)), jnp.repeat(labels, 15)),
    )
    yield "Conv4, Omniglot 5-way 1-shot", conv, task


def temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def main():
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}")
    print("| model | inner steps | iMAML temp MiB | MAML (rolled) temp MiB |")
    print("| --- | --- | --- | --- |")
    for label, model, task in problems():
        params = model.model.init(jax.random.key(2))[0]
        for n in STEPS:
            imaml_mib = (
                temp_bytes(imaml(model, inner_steps=n).task_grad, params, task, context()) / 2**20
            )

            def maml_grad(p, n=n, model=model, task=task):
                return jax.grad(
                    lambda q: maml_loss(
                        inner_loss(model, context()),
                        q,
                        task.support,
                        task.query,
                        inner_lr=0.01,
                        num_steps=n,
                        unroll=1,
                    )
                )(p)

            maml_mib = temp_bytes(maml_grad, params) / 2**20
            print(f"| {label} | {n} | {imaml_mib:.2f} | {maml_mib:.2f} |")


if __name__ == "__main__":
    main()
