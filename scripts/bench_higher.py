"""The PyTorch peer of ``scripts/bench.py``: the same meta-step with ``higher``.

As in higher's own MAML example: one ``higher.innerloop_ctx`` per task (higher cannot batch
tasks), plain SGD inside with ``copy_initial_weights=False``, the query loss of each task
back-propagated into the meta-parameters, then one Adam step. Second order tracks higher
gradients; first order (``track_higher_grads=False``) detaches the fast weights after every
inner step, so the query gradient with respect to the adapted weights is added to the
meta-parameters' gradients by hand (first-order MAML).

The networks, samplers, timing and peak memory are ``bench_torch``'s, shared with the other
PyTorch peers (``TorchConv4``, ``sinusoid_mlp`` and the samplers are re-exported here).
"""

from __future__ import annotations

from typing import Any

import higher
import torch
from bench_torch import (  # noqa: F401  (re-exported: the peers' shared networks)
    TorchConv4,
    omniglot_sampler,
    setup,
    sinusoid_mlp,
    sinusoid_sampler,
    time_steps,
)
from torch import nn


def make_step(spec: dict[str, Any], model: nn.Module, sample, loss_fn):
    """One meta-step of MAML (or first-order MAML) with higher."""
    meta_opt = torch.optim.Adam(model.parameters(), lr=spec["outer_lr"])
    inner_opt = torch.optim.SGD(model.parameters(), lr=spec["inner_lr"])
    second_order = spec["order"] == "second"
    mb = spec["meta_batch"]

    def step() -> float:
        (xs, ys), (xq, yq) = sample()
        meta_opt.zero_grad(set_to_none=False)
        total = 0.0
        for i in range(mb):
            with higher.innerloop_ctx(
                model, inner_opt, copy_initial_weights=False, track_higher_grads=second_order
            ) as (fmodel, diffopt):
                for _ in range(spec["inner_steps"]):
                    diffopt.step(loss_fn(fmodel(xs[i]), ys[i]))
                query_loss = loss_fn(fmodel(xq[i]), yq[i]) / mb
                if second_order:
                    query_loss.backward()
                else:
                    grads = torch.autograd.grad(query_loss, fmodel.parameters())
                    for p, g in zip(model.parameters(), grads, strict=True):
                        p.grad.add_(g)
                total += float(query_loss.detach())
        meta_opt.step()
        return total

    return step


def run_higher(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``spec`` with higher; one result row."""
    _, model, sample, loss_fn = setup(spec)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    row = time_steps(spec, make_step(spec, model, sample, loss_fn))
    row.update(batching="loop", compile_s=0.0)  # eager: nothing to compile
    return row
