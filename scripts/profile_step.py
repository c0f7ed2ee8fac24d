"""Where a meta-step's time goes on XLA:CPU: its device ops grouped by kind, and per thread.

    python scripts/profile_step.py --case omniglot_20w1s --inner-steps 1 --order second

Builds the step ``scripts/bench.py`` times (the runner's jitted meta-step, same options:
``--batching``, ``--conv``, ``--cpu-devices``, ...), runs it under ``jax.profiler.trace`` and
reads the Perfetto trace back: milliseconds per step and executions per step of each kind of
HLO op (matrix products, slices/pads/concatenations, elementwise fusions, copies and
transposes, reductions, ...), the ten costliest single ops, and how busy each thread was (with
two XLA:CPU devices both cores should be busy for most of the step).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import jax
from bench import make_specs, parse_args
from bench_jax import build_step

KINDS = [
    ("matrix products", r"^(dot|convolution|custom-call|ynn_|xnn_)"),
    ("slice/pad/concat", r"^(slice|pad|concatenate|dynamic-slice|dynamic-update-slice)"),
    ("copy/transpose", r"^(copy|transpose|bitcast)"),
    ("reductions", r"^(reduce|all-reduce)"),
    ("loops", r"^(while|call|conditional)"),
]


def kind_of(name: str) -> str:
    """The kind of an HLO op from its instruction name.

    >>> kind_of("dot.12"), kind_of("fusion.3"), kind_of("pad.1")
    ('matrix products', 'fusions (elementwise and mixed)', 'slice/pad/concat')
    """
    for kind, pattern in KINDS:
        if re.match(pattern, name):
            return kind
    if "fusion" in name or name.startswith(("loop_", "input_", "wrapped_")):
        return "fusions (elementwise and mixed)"
    return "other"


def load_events(log_dir: str) -> list[dict]:
    (path,) = glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def summarise(events: list[dict], steps: int, wall_ms: float) -> None:
    names = {}
    for e in events:
        names.setdefault((e.get("pid"), e.get("tid")), e.get("name", ""))
    ops = [e for e in events if re.match(r"^[a-z][a-z0-9_\-]*(\.\d+)+$", e.get("name", ""))]
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    by_op = collections.defaultdict(lambda: [0.0, 0])
    busy = collections.defaultdict(float)
    for e in ops:
        ms = e["dur"] / 1e3
        if kind_of(e["name"]) != "loops":  # a loop's time is its body's ops
            by_kind[kind_of(e["name"])][0] += ms
            by_kind[kind_of(e["name"])][1] += 1
            by_op[e["name"]][0] += ms
            by_op[e["name"]][1] += 1
            busy[(e.get("pid"), e.get("tid"))] += ms
    print(f"wall {wall_ms / steps:.1f} ms per step; op time by kind (ms per step, ops per step):")
    total = sum(v[0] for v in by_kind.values())
    for kind, (ms, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kind:<32} {ms / steps:9.3f} {count / steps:9.0f}  {100 * ms / total:5.1f}%")
    print(f"  {'all ops':<32} {total / steps:9.3f}")
    print("costliest ops (ms per step, executions per step):")
    for name, (ms, count) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"  {name:<40} {ms / steps:9.3f} {count / steps:9.0f}")
    print("op time per thread (ms per step; busy share of the wall time):")
    for thread, ms in sorted(busy.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  thread {thread[1]}: {ms / steps:9.1f}  {100 * ms / wall_ms:5.1f}%")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    (spec,) = [s for s in make_specs(args) if s["impl"] == "metalearn"][:1]
    built = build_step(spec)
    compiled = built.jitted.lower(built.state, built.arrays).compile()
    state = built.state
    for _ in range(max(args.warmup, 1)):
        state, metrics = jax.block_until_ready(compiled(state, built.arrays))
    log_dir = tempfile.mkdtemp(prefix="metalearn-profile-")
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        start = time.perf_counter()
        for _ in range(args.steps):
            state, metrics = jax.block_until_ready(compiled(state, built.arrays))
        wall_ms = 1e3 * (time.perf_counter() - start)
    steps = args.steps * built.steps_per_call
    print(
        f"{spec['case']} k={spec['inner_steps']} {spec['order']} order, {built.strategy}, "
        f"{len(jax.devices())} device(s); trace in {log_dir}"
    )
    summarise(load_events(log_dir), steps, wall_ms)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
