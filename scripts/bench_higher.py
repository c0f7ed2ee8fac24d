"""The PyTorch peer of ``scripts/bench.py``: the same meta-step with ``higher``.

As in higher's own MAML example: one ``higher.innerloop_ctx`` per task (higher cannot batch
tasks), plain SGD inside with ``copy_initial_weights=False``, the query loss of each task
back-propagated into the meta-parameters, then one Adam step. Second order tracks higher
gradients; first order (``track_higher_grads=False``) detaches the fast weights after every
inner step, so the query gradient with respect to the adapted weights is added to the
meta-parameters' gradients by hand (first-order MAML).

The networks mirror metalearn's: Conv4 (4 x [3x3 conv, stride 2, batch norm with the current
batch's statistics and no running averages, ReLU], mean over positions, linear head; NCHW, the
layout PyTorch is fast with) and the sinusoid MLP 1-40-40-1 with ReLU. Tasks are sampled on the
device from the same kind of dense uint8 array as metalearn's side, inside the timed step.

Peak memory: ``torch.cuda.max_memory_allocated`` on GPU; on CPU the growth of the process's
peak resident set size during the timed run (``bench.py`` runs each configuration in its own
process).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

import higher
import torch
import torch.nn.functional as F
from bench_jax import MB, OMNIGLOT_TRAIN_SHAPE, rss_peak_mb
from torch import nn


class TorchConv4(nn.Module):
    """Finn et al.'s Omniglot network: 4 x [conv 3x3/2, batch-statistics norm, ReLU], head."""

    def __init__(self, ways: int, filters: int = 64, channels: int = 1):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv2d(channels if i == 0 else filters, filters, 3, stride=2, padding=1)
            for i in range(4)
        )
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(filters)) for _ in range(4))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(filters)) for _ in range(4))
        self.head = nn.Linear(filters, ways)
        for conv in self.convs:
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, scale, bias in zip(self.convs, self.scales, self.biases, strict=True):
            x = conv(x)
            x = F.batch_norm(x, None, None, scale, bias, training=True, eps=1e-3)
            x = F.relu(x)
        return self.head(x.mean(dim=(2, 3)))


def sinusoid_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1)
    )


def omniglot_sampler(spec: dict[str, Any], device: torch.device):
    """Per step: a meta-batch of N-way K-shot episodes from random uint8 images, on device."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    images = torch.randint(0, 256, OMNIGLOT_TRAIN_SHAPE, dtype=torch.uint8, generator=gen)
    images = images.permute(0, 1, 4, 2, 3).contiguous().to(device)  # [C, E, 1, 28, 28]
    num_classes, per_class = images.shape[:2]
    mb, ways, shots, queries = spec["meta_batch"], spec["ways"], spec["shots"], spec["queries"]

    def sample():
        classes = torch.rand(mb, num_classes, device=device).argsort(-1)[:, :ways]
        examples = torch.rand(mb, ways, per_class, device=device).argsort(-1)
        examples = examples[..., : shots + queries]
        x = images[classes[..., None], examples].float() / 255.0  # [mb, ways, k+q, 1, 28, 28]
        labels = torch.rand(mb, ways, device=device).argsort(-1)
        y = labels[..., None].expand(mb, ways, shots + queries)

        def part(sl):
            return x[:, :, sl].flatten(1, 2), y[:, :, sl].flatten(1, 2)

        return part(slice(0, shots)), part(slice(shots, None))

    return sample


def sinusoid_sampler(spec: dict[str, Any], device: torch.device):
    mb, shots, queries = spec["meta_batch"], spec["shots"], spec["queries"]

    def sample():
        amp = torch.empty(mb, 1, 1, device=device).uniform_(0.1, 5.0)
        phase = torch.empty(mb, 1, 1, device=device).uniform_(0.0, math.pi)
        x = torch.empty(mb, shots + queries, 1, device=device).uniform_(-5.0, 5.0)
        y = amp * torch.sin(x - phase)
        return (x[:, :shots], y[:, :shots]), (x[:, shots:], y[:, shots:])

    return sample


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
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(spec.get("torch_threads") or cores)
    torch.manual_seed(0)
    if spec["kind"] == "sinusoid":
        model, sample, loss_fn = sinusoid_mlp(), sinusoid_sampler(spec, device), F.mse_loss
    else:
        model = TorchConv4(spec["ways"])
        sample, loss_fn = omniglot_sampler(spec, device), F.cross_entropy
    model = model.to(device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    step = make_step(spec, model, sample, loss_fn)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss_before = rss_peak_mb()
    times, first_s, loss = [], 0.0, float("nan")
    cpu_times = []
    for i in range(spec["warmup"] + spec["steps"]):
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = step()
        sync()
        elapsed = time.perf_counter() - start
        if i == 0:
            first_s = elapsed
        if i >= spec["warmup"]:
            times.append(elapsed)
            cpu_times.append(time.process_time() - cpu_start)
    rss_delta = rss_peak_mb() - rss_before
    row = {
        "device": f"cuda:{torch.cuda.get_device_name()}" if cuda else "cpu",
        "batching": "loop",
        "ms_per_step": 1e3 * statistics.median(times) if times else None,
        "ms_min": 1e3 * min(times) if times else None,
        "cpu_ms_per_step": 1e3 * statistics.median(cpu_times) if cpu_times else None,
        "compile_s": 0.0,  # eager: nothing to compile
        "first_step_s": first_s,
        "final_metric": loss,
        "rss_peak_delta_mb": rss_delta,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
    }
    if cuda:
        row["peak_mem_mb"] = (torch.cuda.max_memory_allocated() - base) / MB
        row["peak_mem_kind"] = "cuda_max_memory_allocated_minus_baseline"
    else:
        row["peak_mem_mb"] = rss_delta
        row["peak_mem_kind"] = "rss_peak_delta"
    return row
