"""The ``torch.func`` peer of ``scripts/bench.py`` (``--impl torchfunc`` and
``torchfunc_compile``), written as PyTorch's own functorch MAML-Omniglot example
(``functorch/examples/maml_omniglot/maml-omniglot-transforms.py``) writes it.

Per task: the inner loss is ``functional_call`` of the model on a dict of parameters, each inner
step ``grad`` of it and a plain SGD update of the dict, and the query loss of the adapted dict is
returned; ``vmap`` maps that function over the tasks of the meta-batch (the parameters broadcast,
the data mapped), the mean of the query losses is back-propagated into the module's parameters
and Adam steps. Second order keeps the inner gradients in the graph (``grad`` under the outer
backward differentiates them); first order detaches each inner gradient before the update, so
the meta-gradient is the query gradient at the adapted parameters (first-order MAML). The mean
over tasks (not the example's sum) keeps the same objective as metalearn and higher.

Batch norm with the current batch's statistics inside ``vmap``: the network is
``bench_torch``'s ``TorchConv4`` with ``norm="explicit"``: each block normalises with the mean
and biased variance of the batch it is given, written as tensor operations, with no running
buffers and no state written back. Under ``vmap`` the batch a task's call sees is that task's
own set (support and query separately, as metalearn's ``BatchStatNorm`` does). The example's
``nn.BatchNorm2d(track_running_stats=False)`` (``F.batch_norm`` with no buffers, which ``vmap``
batches by its own rule) gives a wrong second-order meta-gradient under ``vmap`` in PyTorch
2.13: 7-11% off metalearn's in float64 on Conv4 5-way 1-shot, where higher's, with the same
operator and no ``vmap``, agrees with metalearn's to 1e-14; without ``vmap``, ``grad`` of it is
exact too. The explicit form is exact under ``vmap`` (tests/scripts/test_bench_torchfunc.py),
and costs the same arithmetic. (Running averages could not be used anyway: ``vmap`` refuses the
in-place update of a buffer the tasks share.)

``torchfunc_compile`` runs the same meta-loss function (the ``vmap`` of the inner loop, with
its ``grad``) under ``torch.compile``; the backward of the compiled graph is the double
backward second order needs. A configuration whose compilation fails is reported with an
``unsupported`` field (one line: why) instead of a time. ``compile_s`` is the first step's
seconds less a timed step's (tracing and Inductor's code generation), and the row counts the
graphs Dynamo compiled and its graph breaks (a break means part of the step ran eagerly).
"""

from __future__ import annotations

from typing import Any

import torch
from bench_torch import setup, time_steps
from torch import nn
from torch.func import functional_call, grad, vmap


def meta_loss_fn(spec: dict[str, Any], model: nn.Module, loss_fn):
    """``meta_loss(params, xs, ys, xq, yq)``: the mean over tasks of the query loss after
    ``spec["inner_steps"]`` SGD steps from ``params`` (a dict) on each task's support set."""
    second_order = spec["order"] == "second"
    inner_lr, inner_steps = spec["inner_lr"], spec["inner_steps"]

    def loss(params, x, y):
        return loss_fn(functional_call(model, params, (x,)), y)

    def task_loss(params, x_support, y_support, x_query, y_query):
        for _ in range(inner_steps):
            grads = grad(loss)(params, x_support, y_support)
            if not second_order:
                grads = {k: g.detach() for k, g in grads.items()}
            params = {k: params[k] - inner_lr * grads[k] for k in params}
        return loss(params, x_query, y_query)

    per_task = vmap(task_loss, in_dims=(None, 0, 0, 0, 0))

    def meta_loss(params, xs, ys, xq, yq):
        return per_task(params, xs, ys, xq, yq).mean()

    return meta_loss


def make_step(spec: dict[str, Any], model: nn.Module, sample, loss_fn, *, compile: bool = False):
    """One meta-step (sample, meta-gradient into ``.grad``, Adam); returns the meta-loss."""
    meta_opt = torch.optim.Adam(model.parameters(), lr=spec["outer_lr"])
    meta_loss = meta_loss_fn(spec, model, loss_fn)
    if compile:
        meta_loss = torch.compile(meta_loss)

    def step() -> float:
        (xs, ys), (xq, yq) = sample()
        meta_opt.zero_grad(set_to_none=False)
        loss = meta_loss(dict(model.named_parameters()), xs, ys, xq, yq)
        loss.backward()
        meta_opt.step()
        return float(loss.detach())

    return step


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def run_torchfunc(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``spec`` with torch.func (``spec["impl"] == "torchfunc_compile"``: compiled)."""
    compiled = spec["impl"] == "torchfunc_compile"
    _, model, sample, loss_fn = setup(spec, norm="explicit")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    step = make_step(spec, model, sample, loss_fn, compile=compiled)
    if not compiled:
        row = time_steps(spec, step)
        row.update(batching="vmap", compile_s=0.0)  # eager: nothing to compile
        return row
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # this configuration's compilation and counts alone (--no-isolate)
    counters.clear()
    try:
        row = time_steps(spec, step)
    except Exception as error:  # a transform or a double backward torch.compile cannot take
        return {
            "batching": "vmap",
            "unsupported": f"torch.compile {torch.__version__}: {one_line(error)}",
            "torch_version": torch.__version__,
        }
    row.update(
        batching="vmap",
        compile_s=max(row["first_step_s"] - (row["ms_per_step"] or 0.0) / 1e3, 0.0),
        compile_graphs=int(counters["stats"]["unique_graphs"]),
        graph_breaks=int(sum(counters["graph_break"].values())),
    )
    return row
