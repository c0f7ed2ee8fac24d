"""The parallel-metalearn peer of ``scripts/bench.py`` (``--impl parallel_metalearn``).

parallel-metalearn 0.5.6 (PyPI) installs a top-level package named ``metalearn``, the name of
ours, so this script runs in an environment of its own: ``bench.py`` starts it with that
environment's interpreter (``--pml-python``) and without ``PYTHONPATH``, so the ``metalearn``
it imports is parallel-metalearn's (checked: :func:`import_pml`). It imports only PyTorch, NumPy
and ``bench_torch``/``bench_common`` from this directory.

Configured as its README says for speed: ``metalearn.algorithms.MAML`` with
``backend="vmap"`` and ``chunk_size`` equal to the meta-batch (one vectorised chunk: "full
vectorization"; smaller chunks only trade speed for memory), an ``InnerSGD`` inner optimiser at
the case's rate with ``learn_lr=False`` (plain MAML, not Meta-SGD) and ``first_order`` for
first-order MAML, Adam outside, no label encoder (the sampled labels are already 0..N-1).

The networks are ``bench_torch``'s, split as its ``MAML_Model`` wants them (a backbone and a
head, whose ``forward`` take its keyword flags), with Conv4's batch norm its own ``BatchNorm``
layer (what its ``ModelTranslator`` puts in place of ``nn.BatchNorm2d``) with
``track_running_stats=False``: the current batch's mean and biased variance, as tensor
operations, each task's own under its ``vmap`` (our batch-norm convention, expressible). So is
every case of the table (MAML and FOMAML with 1 or 5 SGD steps). The sinusoid's regression loss
is a ``BaseLoss`` subclass, its documented way to a loss it does not ship (it has cross-entropy
only).

    PYTHON_PML scripts/bench_pml.py --row SPEC          # one timed row, JSON on stdout
    PYTHON_PML scripts/bench_pml.py --grad-check IN OUT # the float64 meta-gradient (tests)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import json
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from bench_torch import BN_EPS, TorchConv4, setup, sinusoid_mlp, time_steps
from torch import nn


def import_pml():
    """parallel-metalearn's modules; SystemExit (one line) where ``metalearn`` is another one."""
    # By name: ruff (and a reader) would take ``from metalearn...`` for this repository's package.
    try:
        algorithms, inner, losses, wrappers = (
            importlib.import_module(f"metalearn.{name}")
            for name in ("algorithms", "inner_optimizers", "loss", "model_wrappers")
        )
        MAML, InnerSGD, MAML_Model = algorithms.MAML, inner.InnerSGD, wrappers.MAML_Model
        BaseLoss, CategoricalAccuracy = losses.BaseLoss, losses.CategoricalAccuracy
        CrossEntropy = losses.CrossEntropy
    except (ImportError, AttributeError) as error:
        found = importlib.util.find_spec("metalearn")
        where = found.origin if found else "nowhere"
        sys.exit(
            f"error: {sys.executable} has no parallel-metalearn (metalearn found at {where}): "
            f"{error}; install parallel-metalearn==0.5.6 in an environment of its own"
        )
    return MAML, InnerSGD, BaseLoss, CategoricalAccuracy, CrossEntropy, MAML_Model


class Keywords(nn.Module):
    """``module`` with ``forward(x, **flags)``: MAML_Model passes its flags (``training``,
    ``num_step``) to the backbone and the head; these networks have no use for them."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor, **flags) -> torch.Tensor:
        del flags
        return self.module(x)


class Conv4Backbone(nn.Module):
    """``net`` (a ``TorchConv4``) less its head and norms, normalised by parallel-metalearn's
    ``BatchNorm`` instead."""

    def __init__(self, net: TorchConv4):
        super().__init__()
        norm = importlib.import_module("metalearn.nn_models.basic_layers.BatchNormalization")
        filters = net.head.in_features
        del net.head, net.scales, net.biases
        self.net = net
        self.norms = nn.ModuleList(
            norm.BatchNorm(filters, eps=BN_EPS, track_running_stats=False) for _ in range(4)
        )

    def forward(self, x: torch.Tensor, **flags) -> torch.Tensor:
        for i, norm in enumerate(self.norms):
            x = F.relu(norm(self.net.conv(i, x), **flags))
        return x.mean(dim=(2, 3))


def torch_order(spec: dict[str, Any], model: nn.Module) -> list[nn.Parameter]:
    """The MAML_Model's parameters in ``TorchConv4``'s (or ``sinusoid_mlp``'s) order."""
    if spec["kind"] == "sinusoid":
        return list(model.parameters())
    backbone = model.backbone
    convs = [p for conv in backbone.net.convs for p in (conv.weight, conv.bias)]
    scales = [norm.weight for norm in backbone.norms]
    biases = [norm.bias for norm in backbone.norms]
    return convs + scales + biases + list(model.head.parameters())


def pml_model(spec: dict[str, Any], padding: str = "torch"):
    """(MAML_Model, loss) for ``spec``: bench_torch's network, its head split off."""
    MAML, InnerSGD, BaseLoss, CategoricalAccuracy, CrossEntropy, MAML_Model = import_pml()
    if spec["kind"] == "sinusoid":
        net = sinusoid_mlp()
        head, net[4] = net[4], nn.Identity()

        class MSE(BaseLoss):
            def forward(self, out_dict, targets, model_states=None, **kwargs):
                loss = F.mse_loss(out_dict["logits"], targets)
                return loss, loss.detach()

        loss = MSE()
    else:
        net = TorchConv4(spec["ways"], padding=padding)
        head = net.head
        loss = CrossEntropy(metric_fn=CategoricalAccuracy())
        return MAML_Model(backbone=Conv4Backbone(net), head=Keywords(head)), loss
    return MAML_Model(backbone=Keywords(net), head=Keywords(head)), loss


def pml_algorithm(spec: dict[str, Any], model, loss, device, outer: type = torch.optim.Adam):
    MAML, InnerSGD, *_ = import_pml()
    inner = InnerSGD(
        initial_fast_weights=model.get_fast_weights(),
        inner_lr=spec["inner_lr"],
        first_order=spec["order"] == "first",
        max_inner_steps=max(spec["inner_steps"], 1),
        learn_lr=False,
    )
    # Its rate is made in float32; in the float64 check it must be the rate itself in float64.
    inner.to(dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        for rate in inner.parameters():
            rate.fill_(spec["inner_lr"])
    return MAML(
        model=model,
        optimizer=outer(model.parameters(), lr=spec["outer_lr"]),
        inner_optimizer=inner,
        support_loss_fn=loss,
        inner_steps=spec["inner_steps"],
        chunk_size=spec["meta_batch"],  # one chunk: full vectorisation (its README)
        backend="vmap",
        device=device,
    )


def as_targets(spec: dict[str, Any], y: torch.Tensor):
    return y if spec["kind"] == "sinusoid" else {"labels": y}


def tasks(spec: dict[str, Any], sample):
    """The iterator MAML.step draws a meta-batch from (sampled inside the step, on device)."""
    for _ in itertools.count():
        (xs, ys), (xq, yq) = sample()
        yield xs, as_targets(spec, ys), xq, as_targets(spec, yq)


def run_pml(spec: dict[str, Any]) -> dict[str, Any]:
    device, _, sample, _ = setup(spec)
    torch.manual_seed(0)  # the same initial weights as the other peers' (and then the same tasks)
    model, loss = pml_model(spec)
    algorithm = pml_algorithm(spec, model.to(device), loss, device)
    batches = tasks(spec, sample)
    row = time_steps(spec, lambda: algorithm.step(batches, training=True)[0])
    from importlib.metadata import version

    row.update(
        batching="vmap",
        compile_s=0.0,  # eager
        chunk_size=algorithm.chunk_size,
        pml_version=version("parallel-metalearn"),
    )
    return row


def grad_check(source: str, target: str) -> None:
    """Load a spec, weights (in ``TorchConv4``/``sinusoid_mlp`` parameter order) and one task
    batch (float64) from ``source``; write the meta-gradient of one MAML.step to ``target``."""
    torch.set_num_threads(1)
    data = np.load(source)
    spec = json.loads(str(data["spec"]))
    model, loss = pml_model(spec, padding="same")
    model = model.double()
    params = torch_order(spec, model)
    assert len(params) == len(list(model.parameters()))
    weights = [data[f"w{i}"] for i in range(len(params))]
    with torch.no_grad():
        for p, w in zip(params, weights, strict=True):
            p.copy_(torch.from_numpy(w))
    algorithm = pml_algorithm(spec, model, loss, torch.device("cpu"))
    xs, xq = (torch.from_numpy(data[k]) for k in ("xs", "xq"))
    ys, yq = (torch.from_numpy(data[k]) for k in ("ys", "yq"))
    batch = (xs, as_targets(spec, ys), xq, as_targets(spec, yq))
    algorithm.step(iter([batch]), training=True)  # .grad holds the gradient Adam then took
    np.savez(target, *[p.grad.numpy() for p in params])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", help="one configuration (JSON) to time; prints its row")
    p.add_argument("--grad-check", nargs=2, metavar=("IN", "OUT"))
    args = p.parse_args(argv)
    import_pml()
    if args.grad_check:
        grad_check(*args.grad_check)
    elif args.row:
        print(json.dumps(run_pml(json.loads(args.row))), flush=True)
    else:
        p.error("give --row SPEC or --grad-check IN OUT")


if __name__ == "__main__":
    main()
