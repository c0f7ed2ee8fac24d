"""Meta-step benchmark: metalearn against its PyTorch peers on the same shapes.

    python scripts/bench.py --case omniglot_5w1s,omniglot_20w1s,sinusoid \\
        --impl metalearn,higher --json experiments/benchmarks/cpu.jsonl

For each case and each (inner steps, order) it reports milliseconds per meta-step (the median
of ``--steps`` timed steps after ``--warmup`` untimed ones), compile seconds and peak memory,
prints a table with the ratio peer ms / metalearn ms, and writes one JSON object per line.

Peers (``--impl``; each an optional extra, none needed by metalearn):

- ``higher``: the archived library's MAML example, one task at a time (``bench_higher``);
- ``torchfunc``: ``torch.func`` (``functional_call``, ``grad``, ``vmap`` over tasks) as
  PyTorch's functorch MAML-Omniglot example writes it; ``torchfunc_compile``: the same under
  ``torch.compile`` (``bench_torchfunc``);
- ``parallel_metalearn``: the parallel-metalearn library (PyPI, a vmapped MAML on torch.func),
  run with ``--pml-python`` (default ``$BENCH_PML_PYTHON``), the interpreter of an environment
  of its own: its top-level package is named ``metalearn`` too (``bench_pml``).

A peer that cannot express a case writes its row with ``unsupported`` (one line: why).

Cases (Finn et al. 2017):

- ``omniglot_5w1s``, ``omniglot_20w1s``: Conv4 with 64 filters (4 x [3x3 conv, stride 2, batch
  norm with the current batch's statistics, ReLU], 28x28x1 inputs), meta-batch 32, 15 queries
  per class, inner lr 0.4, 1 and 5 inner steps, second and first order. Tasks are sampled on
  the device from a uint8 array of random images with Omniglot's shape.
- ``sinusoid``: MLP 1-40-40-1 (ReLU), K=10, 10 queries, meta-batch 25, 1 inner step at 0.01.

The outer optimiser is Adam 1e-3 everywhere. metalearn's side is the runner's jitted meta-step
(``make_meta_step`` + ``make_multi_step`` on the registered model and algorithm), with the
task batching the runner would pick (``--batching auto``) or the ones named. ``higher`` loops
over the tasks as it must (``batching: loop``); the other peers ``vmap`` over them. Each
configuration runs in a fresh process (``--no-isolate`` runs them in this one, except
parallel-metalearn's), so compile times and peak memory are its own.

``--remat-sweep`` measures metalearn's peak memory and step time against the number of inner
steps (default 1, 5, 10, 20) with and without rematerialisation (``algorithm.remat``).

Peak memory (``peak_mem_kind`` says which): on a GPU, the device's ``peak_bytes_in_use`` and
``torch.cuda.max_memory_allocated``; on CPU, the compiled XLA program's memory analysis
(temp + arguments + outputs, less donated buffers) for metalearn, the growth of the process's
peak RSS for the PyTorch peers (``rss_peak_delta_mb`` is reported for all).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

CASES: dict[str, dict[str, Any]] = {
    "omniglot_5w1s": dict(
        kind="omniglot",
        ways=5,
        shots=1,
        queries=15,
        meta_batch=32,
        inner_lr=0.4,
        inner_steps=(1, 5),
        orders=("second", "first"),
    ),
    "omniglot_20w1s": dict(
        kind="omniglot",
        ways=20,
        shots=1,
        queries=15,
        meta_batch=32,
        inner_lr=0.4,
        inner_steps=(1, 5),
        orders=("second", "first"),
    ),
    "sinusoid": dict(
        kind="sinusoid",
        ways=None,
        shots=10,
        queries=10,
        meta_batch=25,
        inner_lr=0.01,
        inner_steps=(1,),
        orders=("second",),
    ),
}
IMPLS = ("metalearn", "higher", "torchfunc", "torchfunc_compile", "parallel_metalearn")
DEFAULT_IMPLS = ("metalearn", "higher")  # the others need more than the bench extra
PEER_BATCHING = {"higher": "loop", "torchfunc": "vmap", "torchfunc_compile": "vmap"}
PEER_BATCHING["parallel_metalearn"] = "vmap"
REMAT_SWEEP_STEPS = (1, 5, 10, 20)


def csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", type=csv_list, default=list(CASES), help=", ".join(CASES))
    p.add_argument("--impl", type=csv_list, default=list(DEFAULT_IMPLS), help=", ".join(IMPLS))
    p.add_argument(
        "--pml-python",
        default=os.environ.get("BENCH_PML_PYTHON"),
        help="parallel_metalearn: the Python of the environment parallel-metalearn is installed "
        "in (default $BENCH_PML_PYTHON)",
    )
    p.add_argument("--json", metavar="OUT", help="write one JSON object per line here")
    p.add_argument("--append", action="store_true", help="append to --json instead of replacing")
    p.add_argument("--steps", type=int, default=10, help="timed meta-steps (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed meta-steps after compiling")
    p.add_argument(
        "--repeat", type=int, default=1, help="fresh processes per configuration (median kept)"
    )
    p.add_argument("--inner-steps", type=csv_list, help="e.g. 1,5 (default: per case)")
    p.add_argument("--order", type=csv_list, help="second,first (default: per case)")
    p.add_argument("--meta-batch", type=int, help="tasks per meta-step (default: per case)")
    p.add_argument(
        "--batching",
        type=csv_list,
        default=["auto"],
        help="metalearn: auto,vmap,unroll,map, or mapN (N parallel lax.map chains, proposed)",
    )
    p.add_argument(
        "--cpu-devices",
        type=csv_list,
        default=["auto"],
        help="metalearn: XLA:CPU devices the tasks are split across (auto: as the runner picks)",
    )
    p.add_argument(
        "--threefry",
        choices=("unrolled", "rolled"),
        default="rolled",
        help="metalearn: threefry lowered as JAX does on CPU (rolled loop, the runner's) or "
        "unrolled (bench_jax.unroll_cpu_threefry; measured: no gain)",
    )
    p.add_argument(
        "--steps-per-call",
        default="auto",
        help="metalearn: meta-steps fused per jitted call; auto: as the runner fuses them for "
        "dense models (sinusoid: 100), 1 for Conv4 (a 0.1-3 s step: dispatch costs nothing)",
    )
    p.add_argument(
        "--conv",
        type=csv_list,
        default=["auto"],
        help="metalearn Conv4 layers: auto, xla, im2col (model.conv)",
    )
    p.add_argument(
        "--inner-unroll",
        default="default",
        help="metalearn MAML inner loop: default (the library's: unrolled up to 10 steps, rolled "
        "beyond), full (unrolled), or N (N steps per scan iteration; 1: rolled)",
    )
    p.add_argument("--remat", action="store_true", help="metalearn: rematerialise inner steps")
    p.add_argument(
        "--remat-sweep",
        action="store_true",
        help="metalearn only: memory vs inner steps (default 1,5,10,20), remat off and on",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        help="PyTorch peers: torch threads (default: the cores usable)",
    )
    p.add_argument(
        "--compile-cache",
        action="store_true",
        help="keep JAX's persistent compilation cache if configured (compile_s is then a load)",
    )
    p.add_argument("--no-isolate", action="store_true", help="run every config in this process")
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="only measure the matrix-product ceiling (GFLOP/s) with the Conv4 runner's devices",
    )
    p.add_argument(
        "--markdown", nargs="+", metavar="JSONL", help="print these results as a Markdown table"
    )
    p.add_argument(
        "--count-flops",
        metavar="JSONL",
        help="fill in gflop_per_step and gflop_s of this file's metalearn rows that lack them "
        "(a backend that gave no count), counting the same step on this machine",
    )
    p.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one spec (JSON), print row
    args = p.parse_args(argv)
    if args.steps_per_call != "auto" and not args.steps_per_call.isdigit():
        p.error(f"--steps-per-call takes auto or a positive integer; got {args.steps_per_call!r}")
    for name in args.case:
        if name not in CASES:
            p.error(f"unknown case {name!r}; known: {', '.join(CASES)}")
    for impl in args.impl:
        if impl not in IMPLS:
            p.error(f"unknown impl {impl!r}; known: {', '.join(IMPLS)}")
    if "parallel_metalearn" in args.impl and not args.markdown:
        python = args.pml_python
        if not python:
            p.error(
                "--impl parallel_metalearn needs --pml-python PATH (or $BENCH_PML_PYTHON): the "
                "Python of an environment with parallel-metalearn==0.5.6, apart from this one"
            )
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            p.error(f"--pml-python {python}: no such interpreter")
    for order in args.order or []:
        if order not in ("second", "first"):
            p.error(f"--order takes second,first; got {order!r}")
    for strategy in args.batching:
        if strategy not in ("auto", "vmap", "unroll", "map") and not (
            strategy.startswith("map") and strategy[3:].isdigit()
        ):
            p.error(f"--batching takes auto,vmap,unroll,map,mapN; got {strategy!r}")
    return args


def make_specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One spec per (case, inner steps, order, impl, batching, remat)."""
    specs = []
    for name in args.case:
        case = CASES[name]
        if args.inner_steps:
            inner_steps = [int(s) for s in args.inner_steps]
        elif args.remat_sweep:
            inner_steps = list(REMAT_SWEEP_STEPS)
        else:
            inner_steps = list(case["inner_steps"])
        orders = args.order or list(case["orders"])
        if args.remat_sweep and not args.order:
            orders = ["second"]
        remats = [False, True] if args.remat_sweep else [args.remat]
        impls = ["metalearn"] if args.remat_sweep else args.impl
        for steps in inner_steps:
            for order in orders:
                for impl in impls:
                    batchings = args.batching if impl == "metalearn" else [PEER_BATCHING[impl]]
                    convs = (
                        args.conv if impl == "metalearn" and case["kind"] != "sinusoid" else ["-"]
                    )
                    devices = args.cpu_devices if impl == "metalearn" else ["-"]
                    for batching, conv, cpu_devices in itertools.product(batchings, convs, devices):
                        for remat in remats if impl == "metalearn" else [False]:
                            base = {k: v for k, v in case.items() if k not in ("orders",)}
                            base.update(
                                case=name,
                                impl=impl,
                                inner_steps=steps,
                                order=order,
                                batching=batching,
                                conv=conv,
                                cpu_devices=cpu_devices,
                                threefry=args.threefry,
                                remat=remat,
                                meta_batch=args.meta_batch or case["meta_batch"],
                                outer_lr=1e-3,
                                steps=args.steps,
                                warmup=args.warmup,
                                steps_per_call=args.steps_per_call if impl == "metalearn" else 1,
                                torch_threads=args.torch_threads,
                                compile_cache=args.compile_cache,
                                inner_unroll=args.inner_unroll,
                            )
                            if impl == "parallel_metalearn":
                                base["pml_python"] = args.pml_python
                            specs.append(base)
    return specs


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this process; the spec's fields plus the measurements."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if spec["impl"] == "metalearn":
        import jax
        from bench_jax import run_metalearn

        cached = jax.config.jax_enable_compilation_cache
        if not spec.get("compile_cache"):
            jax.config.update("jax_enable_compilation_cache", False)  # time real compiles
        try:
            result = run_metalearn(spec)
        finally:
            jax.config.update("jax_enable_compilation_cache", cached)
        result["jax_version"] = jax.__version__
    elif spec["impl"] == "higher":
        from bench_higher import run_higher

        result = run_higher(spec)
    elif spec["impl"] in ("torchfunc", "torchfunc_compile"):
        from bench_torchfunc import run_torchfunc

        result = run_torchfunc(spec)
    else:
        result = run_pml_process(spec)
    keep = ("case", "impl", "kind", "inner_steps", "order", "meta_batch", "ways", "shots")
    row = {k: spec[k] for k in keep}
    row.update(queries=spec["queries"], remat=spec["remat"], conv=spec.get("conv", "-"))
    row.update(steps=spec["steps"])
    row.update(steps_per_call=spec["steps_per_call"], warmup=spec["warmup"])
    row.update(inner_unroll=spec.get("inner_unroll", "default"))
    row.update(threefry=spec.get("threefry", "-") if spec["impl"] == "metalearn" else "-")
    row.update(result)
    row["load_1m"] = load
    row["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    row["host"] = f"{platform.machine()} {os.cpu_count()} cpus"
    return row


def run_pml_process(spec: dict[str, Any]) -> dict[str, Any]:
    """parallel-metalearn's row, measured by ``bench_pml.py`` under ``spec["pml_python"]``,
    always in a process of its own: without ``PYTHONPATH`` (which may hold this checkout), so
    the ``metalearn`` it imports is parallel-metalearn's, not ours."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_pml.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return run_isolated(spec, script, python=spec["pml_python"], env=env)


def measure_ceiling(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--ceiling``: matrix-product GFLOP/s in a fresh process, printed and written."""
    if args.no_isolate:
        from bench_jax import matmul_ceiling

        rows = matmul_ceiling()
    else:
        code = "import json, bench_jax; print(json.dumps(bench_jax.matmul_ceiling()))"
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        if proc.returncode != 0:
            sys.exit(f"error: the ceiling run failed: {proc.stderr.strip()[-500:]}")
        rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for row in rows:
        row["load_1m"] = os.getloadavg()[0]
        print(f"{row['shape']:<36} {row['ms_per_call']:9.2f} ms {row['gflop_s']:8.1f} GFLOP/s")
    if args.json:
        with open(args.json, "a" if args.append else "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    return rows


def run_isolated(
    spec: dict[str, Any],
    script: str = __file__,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one configuration in a child process (fresh compile caches and memory peaks):
    ``python script --row SPEC``, whose last JSON line on stdout is the row
    (``scripts/bench_rl.py`` and the parallel-metalearn peer run their rows through this too)."""
    env = dict(os.environ if env is None else env)
    if not spec.get("compile_cache"):
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run(
        [python, os.path.abspath(script), "--row", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        return {**spec, "error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def merge_repeats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for a configuration run in several processes: the run with the median
    ``ms_per_step``, plus every run's median and minimum (``ms_per_step_runs``, ``ms_min``).

    >>> row = merge_repeats([{"ms_per_step": 3.0, "ms_min": 2.0}, {"ms_per_step": 1.0,
    ...     "ms_min": 0.9}, {"ms_per_step": 2.0, "ms_min": 1.5}])
    >>> row["ms_per_step"], row["ms_min"], row["ms_per_step_runs"], row["processes"]
    (2.0, 0.9, [3.0, 1.0, 2.0], 3)
    """
    if len(runs) == 1:
        return runs[0]
    failed = [r for r in runs if "error" in r or r.get("ms_per_step") is None]
    if failed:
        return failed[0]
    good = runs
    ordered = sorted(good, key=lambda r: r["ms_per_step"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["ms_per_step_runs"] = [r["ms_per_step"] for r in good]
    row["ms_min"] = min(r["ms_min"] for r in good)
    row["processes"] = len(good)
    return row


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_table(rows: list[dict[str, Any]], out=None) -> None:
    """A fixed-width table; on a peer's row, ``ratio`` = its ms / metalearn's ms for the same
    configuration (metalearn's fastest row of it)."""
    out = out or sys.stdout
    metalearn_ms: dict[tuple, float] = {}
    for r in rows:
        key = (r["case"], r["inner_steps"], r["order"])
        if r["impl"] == "metalearn" and r.get("ms_per_step"):
            metalearn_ms[key] = min(r["ms_per_step"], metalearn_ms.get(key, float("inf")))
    header = (
        f"{'case':<15} {'impl':<18} {'batch':<6} {'conv':<6} {'dev':>3} {'k':>2} {'order':<6} "
        f"{'remat':<5} "
        f"{'ms/step':>9} {'min ms':>9} {'cpu ms':>9} {'compile s':>9} {'peak MB':>8} "
        f"{'mem kind':<12} {'GFLOP/s':>7} {'ratio':>7} {'load':>5}"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<15} {r['impl']:<18} ERROR {r['error'][:200]}", file=out)
            continue
        if r.get("unsupported"):
            label = f"{r['case']:<15} {r['impl']:<18} k={r['inner_steps']} {r['order']}"
            print(f"{label} UNSUPPORTED {r['unsupported'][:200]}", file=out)
            continue
        ratio = None
        ref = metalearn_ms.get((r["case"], r["inner_steps"], r["order"]))
        if r["impl"] != "metalearn" and ref and r.get("ms_per_step"):
            ratio = r["ms_per_step"] / ref
        kind = {"xla_memory_analysis": "xla-program", "rss_peak_delta": "rss-delta"}.get(
            r.get("peak_mem_kind"), r.get("peak_mem_kind", "-")[:12]
        )
        print(
            f"{r['case']:<15} {r['impl']:<18} {r['batching']:<6} {r.get('conv', '-'):<6} "
            f"{fmt(r.get('num_devices')):>3} {r['inner_steps']:>2} "
            f"{r['order']:<6} {str(r['remat']):<5} {fmt(r.get('ms_per_step'), 2):>9} "
            f"{fmt(r.get('ms_min'), 2):>9} {fmt(r.get('cpu_ms_per_step'), 1):>9} "
            f"{fmt(r.get('compile_s'), 1):>9} {fmt(r.get('peak_mem_mb'), 1):>8} {kind:<12} "
            f"{fmt(r.get('gflop_s'), 1):>7} {fmt(ratio, 2):>7} {fmt(r.get('load_1m'), 1):>5}",
            file=out,
        )
    print(
        "ratio = peer ms/step / metalearn ms/step (medians; > 1: metalearn faster); "
        "cpu ms = process CPU time per step (all threads); load = 1-min load average",
        file=out,
    )


MARKDOWN_COLUMNS = [
    ("case", "case"),
    ("impl", "impl"),
    ("batching", "batching"),
    ("conv", "conv"),
    ("num_devices", "devices"),
    ("inner_steps", "k"),
    ("order", "order"),
    ("remat", "remat"),
    ("inner_unroll", "inner unroll"),
    ("steps_per_call", "fused"),
    ("ms_per_step", "ms/step"),
    ("ms_min", "min ms"),
    ("cpu_ms_per_step", "CPU ms"),
    ("compile_s", "compile s"),
    ("gflop_per_step", "GFLOP"),
    ("gflop_s", "GFLOP/s"),
    ("peak_mem_mb", "peak MB"),
    ("peak_mem_kind", "memory kind"),
    ("xla_temp_mb", "XLA temp MB"),
    ("rss_peak_delta_mb", "RSS delta MB"),
    ("torch_threads", "torch threads"),
    ("load_1m", "load"),
    ("unsupported", "unsupported"),
]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The JSON rows as a Markdown table (for experiments/benchmarks/README.md)."""
    lines = [
        "| " + " | ".join(title for _, title in MARKDOWN_COLUMNS) + " |",
        "|" + "---|" * len(MARKDOWN_COLUMNS),
    ]
    for r in rows:
        cells = []
        for key, _ in MARKDOWN_COLUMNS:
            value = r.get(key)
            digits = 2 if key in ("ms_per_step", "ms_min") and (value or 0) < 10 else 1
            cells.append(fmt(value, digits) if key != "error" else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def count_flops(path: Path) -> list[dict[str, Any]]:
    """``--count-flops``: XLA's FLOP count of each metalearn row's step (the same case, inner
    steps, order, meta-batch and convolution) on this machine, for rows measured where the
    backend gave none; rewrites ``path`` with ``gflop_per_step``, ``gflop_s`` and
    ``gflop_counted_on`` added. The count is of the program before device-specific fusion, so
    it does not depend on the backend that ran the step."""
    import jax
    from bench_jax import step_gflop

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    counted: dict[tuple, float | None] = {}
    for row in rows:
        if row.get("impl") != "metalearn" or row.get("gflop_per_step") or not row["ms_per_step"]:
            continue
        key = (row["case"], row["inner_steps"], row["order"], row["meta_batch"], row["conv"])
        if key not in counted:
            argv = ["--case", row["case"], "--impl", "metalearn", "--batching", "vmap"]
            argv += ["--inner-steps", str(row["inner_steps"]), "--order", row["order"]]
            argv += ["--meta-batch", str(row["meta_batch"])]
            argv += ["--conv", row["conv"]] if row["conv"] != "-" else []
            argv += ["--remat"] if row.get("remat") else []
            (spec,) = make_specs(parse_args(argv))  # the spec the timed run was built from
            counted[key] = step_gflop(spec)
        if counted[key]:
            row["gflop_per_step"] = counted[key]
            row["gflop_s"] = counted[key] / (row["ms_per_step"] / 1e3)
            row["gflop_counted_on"] = jax.devices()[0].platform
            print(
                f"{' '.join(map(str, key))}: {counted[key]:.1f} GFLOP/step, "
                f"{row['gflop_s']:.0f} GFLOP/s on {row['device']}"
            )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.markdown:
        rows = [
            json.loads(line)
            for path in args.markdown
            for line in Path(path).read_text().splitlines()
            if line.strip()
        ]
        print(markdown_table(rows))
        return rows
    if args.row:
        print(json.dumps(run_spec(json.loads(args.row))), flush=True)
        return []
    if args.ceiling:
        return measure_ceiling(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.count_flops:
        return count_flops(Path(args.count_flops))
    out = None
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        out = open(args.json, "a" if args.append else "w")  # noqa: SIM115
    rows = []
    try:
        for spec in make_specs(args):
            label = (
                f"{spec['case']} {spec['impl']} {spec['batching']} k={spec['inner_steps']} "
                f"{spec['order']} remat={spec['remat']}"
            )
            print(f"... {label}", file=sys.stderr, flush=True)
            # parallel-metalearn's rows run in a process of its own environment either way
            here = args.no_isolate or spec["impl"] == "parallel_metalearn"
            runs = [run_spec(spec) if here else run_isolated(spec) for _ in range(args.repeat)]
            row = merge_repeats(runs)
            rows.append(row)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    finally:
        if out:
            out.close()
    print_table(rows)
    return rows


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
