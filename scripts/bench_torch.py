"""The PyTorch side every peer of ``scripts/bench.py`` shares: the networks, the task samplers
and the timing loop, in PyTorch and the standard library only (``bench_pml`` imports this module
in parallel-metalearn's own environment, which has neither JAX nor higher).

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
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from bench_common import MB, OMNIGLOT_TRAIN_SHAPE, rss_peak_mb
from torch import nn

BN_EPS = 1e-3  # metalearn's BatchStatNorm (TensorFlow's default, as in Finn et al.'s code)


def same_padding(size: int, kernel: int = 3, stride: int = 2) -> tuple[int, int]:
    """XLA's (and TensorFlow's) "SAME" padding of one axis, (before, after): the extra row goes
    after, where PyTorch's ``padding=1`` puts one on each side.

    >>> same_padding(28), same_padding(7), same_padding(4)
    ((0, 1), (1, 1), (0, 1))
    """
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def batch_stat_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Batch norm of NCHW ``x`` with its own mean and biased variance per channel, as tensor
    operations (``F.batch_norm(x, None, None, scale, bias, training=True)``'s values)."""
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    var = (x - mean).square().mean(dim=(0, 2, 3), keepdim=True)
    inv = torch.rsqrt(var + BN_EPS) * scale[None, :, None, None]
    return (x - mean) * inv + bias[None, :, None, None]


class TorchConv4(nn.Module):
    """Finn et al.'s Omniglot network: 4 x [conv 3x3/2, batch-statistics norm, ReLU], head.

    ``padding="torch"`` (the timed network) pads one pixel on every side, PyTorch's usual form;
    ``"same"`` pads as metalearn's ``padding="SAME"`` does (nothing before, one after, on even
    sizes), for the checks that compare meta-gradients with metalearn's on identical weights.
    The two have the same shapes and arithmetic; only the window's alignment differs.

    ``norm="native"`` normalises with ``F.batch_norm`` (higher's peer); ``"explicit"`` with
    the same mean and biased variance written as tensor operations (:func:`batch_stat_norm`),
    for ``torch.func.vmap``: under ``vmap`` the native operator's second-order gradient is
    wrong in PyTorch 2.13 (a meta-gradient 7-11% off metalearn's and higher's in float64, both of
    which agree to 1e-14; exact without ``vmap``), the explicit form is exact
    (tests/scripts/test_bench_torchfunc.py).
    """

    def __init__(
        self,
        ways: int,
        filters: int = 64,
        channels: int = 1,
        padding: str = "torch",
        norm: str = "native",
    ):
        super().__init__()
        if padding not in ("torch", "same"):
            raise ValueError(f"padding must be 'torch' or 'same', got {padding!r}")
        if norm not in ("native", "explicit"):
            raise ValueError(f"norm must be 'native' or 'explicit', got {norm!r}")
        self.padding, self.norm = padding, norm
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

    def conv(self, i: int, x: torch.Tensor) -> torch.Tensor:
        conv = self.convs[i]
        if self.padding == "torch":
            return conv(x)
        (top, bottom), (left, right) = (same_padding(n) for n in x.shape[-2:])
        x = F.pad(x, (left, right, top, bottom))
        return F.conv2d(x, conv.weight, conv.bias, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Either form normalises with the statistics of the batch it is given (no running
        # buffers); under torch.func.vmap that is each task's own set.
        for i, (scale, bias) in enumerate(zip(self.scales, self.biases, strict=True)):
            x = self.conv(i, x)
            if self.norm == "native":
                x = F.batch_norm(x, None, None, scale, bias, training=True, eps=BN_EPS)
            else:
                x = batch_stat_norm(x, scale, bias)
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


def setup(spec: dict[str, Any], norm: str = "native"):
    """``(device, model, sample, loss_fn)`` for ``spec``, torch's threads set to the spec's (or
    the cores usable) and its seed fixed; ``norm``: ``TorchConv4``'s."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(spec.get("torch_threads") or cores)
    torch.manual_seed(0)
    if spec["kind"] == "sinusoid":
        model, sample, loss_fn = sinusoid_mlp(), sinusoid_sampler(spec, device), F.mse_loss
    else:
        model = TorchConv4(spec["ways"], norm=norm)
        sample, loss_fn = omniglot_sampler(spec, device), F.cross_entropy
    return device, model.to(device), sample, loss_fn


def time_steps(spec: dict[str, Any], step: Callable[[], float]) -> dict[str, Any]:
    """Run ``spec["warmup"]`` untimed then ``spec["steps"]`` timed calls of ``step``; the row's
    timings, peak memory and versions. The first call's seconds are ``first_step_s`` (with
    ``torch.compile``, its compile time)."""
    cuda = torch.cuda.is_available()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss_before = rss_peak_mb()
    times, cpu_times, first_s, loss = [], [], 0.0, float("nan")
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
        "ms_per_step": 1e3 * statistics.median(times) if times else None,
        "ms_min": 1e3 * min(times) if times else None,
        "cpu_ms_per_step": 1e3 * statistics.median(cpu_times) if cpu_times else None,
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
