"""A sweep of N runs as one vectorized program against the same sweep as processes.

    python scripts/bench_sweep.py [--cases sinusoid,omniglot,nav2d] [--runs 1,2,4,8,16,32]
        [--modes vectorized,basic,processes2] [--out experiments/benchmarks/sweep.jsonl]

Each case is a real command line (``python -m metalearn.train -m ...``), timed whole, from a
fresh sweep directory and an empty compilation cache; the N runs differ in their seed. Modes:

- ``vectorized``: ``hydra/launcher=vectorized``, the runs in one compiled program;
- ``basic``: Hydra's basic launcher, the runs one after another in one process;
- ``processes2``: one process per run, two at a time (one per core of a 2-core machine);
- ``processes2t1``: the same, each process's XLA:CPU on one thread
  (``--xla_cpu_multi_thread_eigen=false``: on a 2-core CPU the small MLP's step is about twice
  as fast so, and two such processes share the cores without contention).

Writes one JSONL row per (case, N, mode): wall seconds, per run, the throughput against the
same mode at N = 1, compile seconds (one job's), peak memory of the largest process, and the
device. Runs unchanged on a GPU (the cases then run there as configured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    # the paper's setup, shortened to 5,000 of its 70,000 steps (its evaluation kept)
    "sinusoid": ["+experiment=sinusoid_maml", "trainer.meta_steps=5000"],
    # the CPU Omniglot 5-way 1-shot configuration, shortened
    "omniglot": [
        "+experiment=omniglot_5w1s_cpu",
        "trainer.meta_steps=200",
        "trainer.eval_every=0",
        "eval.num_tasks=100",
    ],
    # Finn et al.'s 2D navigation, shortened
    "nav2d": ["+experiment=rl_nav2d_maml", "trainer.meta_steps=5", "trainer.eval_every=0"],
}
MODES = ("vectorized", "basic", "processes2", "processes2t1")
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"


def command(case: str, seeds: list[int], sweep_dir: Path, mode: str) -> list[list[str]]:
    """The command lines of one sweep (one, or one per run for ``processes2``)."""
    base = [sys.executable, "-m", "metalearn.train", *CASES[case], "trainer.progress_bar=lines"]
    if mode.startswith("processes2"):
        return [[*base, f"seed={s}", f"hydra.run.dir={sweep_dir}/{s}"] for s in seeds]
    launcher = "hydra/launcher=vectorized" if mode == "vectorized" else "hydra/launcher=basic"
    seed_list = ",".join(map(str, seeds))
    return [[*base, "-m", f"seed={seed_list}", launcher, f"hydra.sweep.dir={sweep_dir}"]]


def run(commands: list[list[str]], env: dict, parallel: int) -> tuple[float, float]:
    """Wall seconds of ``commands`` run ``parallel`` at a time, and the peak memory (MiB) of
    the largest of them; any failure is fatal."""

    def one(cmd: list[str]) -> int:
        with tempfile.TemporaryFile("w+") as log:
            child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode:
                log.seek(0)
                sys.exit(f"error: {' '.join(cmd)} failed:\n{log.read()[-3000:]}")
        return usage.ru_maxrss  # KiB on Linux

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        peaks = list(pool.map(one, commands))
    return time.perf_counter() - start, max(peaks) / 1024


def compile_seconds(sweep_dir: Path) -> float | None:
    """One run's compile time, from its summary.json."""
    for summary in sorted(sweep_dir.rglob("summary.json")):
        return json.loads(summary.read_text()).get("compile_seconds")
    return None


def device() -> str:
    probe = "import jax; d = jax.devices()[0]; print(f'{jax.device_count()} x {d.device_kind}')"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return f"{out.stdout.strip()} ({platform.processor() or platform.machine()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--runs", default="1,2,4,8,16,32")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default=str(REPO / "experiments/benchmarks/sweep.jsonl"))
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.runs.split(",")]
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES] + [
        c for c in args.cases.split(",") if c not in CASES
    ]
    if unknown:
        parser.error(f"unknown case or mode: {', '.join(unknown)}")
    on = device()
    print(f"device: {on}", flush=True)
    for case in args.cases.split(","):
        first: dict[str, float] = {}
        for count in counts:
            for mode in modes:
                with tempfile.TemporaryDirectory() as scratch:
                    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": f"{scratch}/cache"}
                    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
                    if mode == "processes2t1":
                        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {ONE_THREAD}".strip()
                    sweep_dir = Path(scratch) / "sweep"
                    cmds = command(case, list(range(count)), sweep_dir, mode)
                    wall, peak = run(cmds, env, 2 if mode.startswith("processes2") else 1)
                    per_run = wall / count
                    first.setdefault(mode, per_run)
                    row = {
                        "case": case,
                        "mode": mode,
                        "runs": count,
                        "wall_s": round(wall, 2),
                        "per_run_s": round(per_run, 3),
                        "throughput_vs_one": round(first[mode] / per_run, 3),
                        "compile_s": compile_seconds(sweep_dir),
                        "peak_mib": round(peak, 1),  # of the largest process
                        "device": on,
                    }
                print(json.dumps(row), flush=True)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
