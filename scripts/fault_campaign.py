"""Fault campaign: kill -9 and damaged checkpoints, each resumed, against a straight run.

    python scripts/fault_campaign.py --kills 20 --corruptions 10 [--seed 0] [--workdir DIR]

First one uninterrupted reference run of a short sinusoid configuration. Then each kill trial
starts the same run in a fresh directory, sends SIGKILL after a random delay (uniform over the
reference run's wall time) and resumes it; each corruption trial kills a fresh run once it has
two checkpoints, damages one random file of its latest checkpoint (truncated, one byte flipped,
or deleted) and resumes. Every trial must end with the reference's final parameters (bit for
bit), its eval.json (byte for byte), the same metrics.jsonl records (each once), and no traceback
in any output. Prints one line per trial and a summary; exit status 1 if any trial failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

CONFIG = [
    "+experiment=sinusoid_maml",
    "+debug=tiny",
    "trainer.meta_steps=60",
    "trainer.steps_per_call=2",
    "trainer.log_every=4",
    "trainer.eval_every=20",
    "trainer.checkpoint_every=4",
    "eval.val_tasks=40",
    "eval.num_tasks=40",
    "eval.tasks_per_call=4",
]
DAMAGES = ("truncate", "flip", "delete")


def launch(run_dir: Path, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "a")  # noqa: SIM115  (the child owns it; closed when it exits)
    return subprocess.Popen(
        [sys.executable, "-m", "metalearn.train", *CONFIG, f"hydra.run.dir={run_dir}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def run_to_end(run_dir: Path, log_path: Path) -> int:
    return launch(run_dir, log_path).wait(timeout=900)


def phase_of(log_text: str, run_dir: Path) -> str:
    """Where a killed run was: start-up, compile, training, save, final evaluation, finished."""
    if "test mse" in log_text:
        return "finished"
    stores = [run_dir / "checkpoints", run_dir / "best"]
    entries = [p for s in stores if s.is_dir() for p in s.iterdir()]
    if any(
        ".orbax-checkpoint-tmp" in p.name  # orbax was writing
        or (p.name.isdigit() and not (p / "checksums.sha256").exists())  # between the two
        for p in entries
    ):
        return "save"
    if "final evaluation on" in log_text or "validation on 40 tasks at step 60" in log_text:
        return "final evaluation"
    if "compiled" in log_text:
        return "training"
    if "training sinusoid" in log_text:
        return "compile"
    return "start-up"


def damage(step_dir: Path, rng: random.Random) -> str:
    """Damage one random file of a checkpoint; describe what was done."""
    files = sorted(p for p in step_dir.rglob("*") if p.is_file())
    target, how = rng.choice(files), rng.choice(DAMAGES)
    data = target.read_bytes()
    if how == "truncate":
        target.write_bytes(data[: rng.randrange(len(data))] if data else b"")
    elif how == "flip" and data:
        i = rng.randrange(len(data))
        target.write_bytes(data[:i] + bytes([data[i] ^ rng.randrange(1, 256)]) + data[i + 1 :])
    else:
        how = "delete"
        target.unlink()
    return f"{how} {target.relative_to(step_dir.parent)}"


def final_state(run_dir: Path):
    from omegaconf import OmegaConf

    from metalearn.config import to_objects
    from metalearn.runner import build, resolve
    from metalearn.runner.checkpoints import CheckpointStore

    cfg = to_objects(OmegaConf.load(run_dir / "config.yaml"))
    store = CheckpointStore(str(run_dir / "checkpoints"), 2)
    state, _ = store.restore(build(resolve(cfg)).initial_state)
    store.close()
    return state


def metrics(run_dir: Path) -> list[tuple]:
    """metrics.jsonl records without their timing, in file order."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        (r["step"], r["split"], json.dumps({k: v for k, v in r.items() if k != "steps_per_s"}))
        for r in records
    ]


def compare(run_dir: Path, reference: Path, reference_state) -> list[str]:
    """What differs from the reference run (empty if nothing)."""
    import jax
    import numpy as np

    problems = []
    state = final_state(run_dir)
    leaves = zip(
        jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(reference_state), strict=True
    )
    if not all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in leaves):
        problems.append("final parameters differ")
    if (run_dir / "eval.json").read_bytes() != (reference / "eval.json").read_bytes():
        problems.append("eval.json differs")
    got, want = metrics(run_dir), metrics(reference)
    if sorted(got) != sorted(want):
        problems.append(f"metrics.jsonl differs ({len(got)} records, reference {len(want)})")
    return problems


def trial(kind: str, index: int, base: Path, reference: Path, ref_state, seconds, rng) -> dict:
    run_dir, log_path = base / f"{kind}{index:02d}", base / f"{kind}{index:02d}.log"
    redrawn = 0
    while True:
        shutil.rmtree(run_dir, ignore_errors=True)
        log_path.unlink(missing_ok=True)
        started = time.perf_counter()
        proc = launch(run_dir, log_path)
        if kind == "kill":
            delay = rng.uniform(0, seconds)
            while proc.poll() is None and time.perf_counter() - started < delay:
                time.sleep(0.01)
        else:  # wait for two checkpoints, then a little more
            while proc.poll() is None and len(list((run_dir / "checkpoints").glob("[0-9]*"))) < 2:
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 1.0))
            delay = None
        if proc.poll() is None or kind != "kill" or redrawn == 5:
            break
        # The run ended before the kill was due (runs vary with the machine's load): a kill of
        # a finished process tests nothing, so draw again within that run's duration.
        seconds, redrawn = time.perf_counter() - started, redrawn + 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    phase = phase_of(log_path.read_text(), run_dir)
    damaged = ""
    if kind == "corrupt":
        latest = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
        damaged = damage(run_dir / "checkpoints" / str(latest), rng)
    with open(log_path, "a") as f:
        f.write("\n==== resume ====\n")
    code = run_to_end(run_dir, log_path)
    text = log_path.read_text()
    resumed = text.split("==== resume ====")[-1]
    problems = [] if code == 0 else [f"resume exited {code}"]
    if "Traceback" in text:
        problems.append("traceback in the output")
    if code == 0:
        problems += compare(run_dir, reference, ref_state)
    fallback = "damaged checkpoint" in resumed
    return {
        "trial": run_dir.name,
        "delay": delay,
        "redrawn": redrawn,
        "seconds": seconds,
        "phase": phase,
        "damage": damaged,
        "fallback": fallback,
        "ok": not problems,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--corruptions", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary dir")
    args = parser.parse_args(argv)
    if args.kills < 0 or args.corruptions < 0:
        print("error: --kills and --corruptions must be >= 0", file=sys.stderr)
        return 2
    base = args.workdir or Path(tempfile.mkdtemp(prefix="fault-campaign-"))
    base.mkdir(parents=True, exist_ok=True)
    # One compilation cache for every run of the campaign (the runner stores every program in
    # it): restarts stay short.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(base / "jax-cache"))
    rng = random.Random(args.seed)
    reference = base / "reference"
    shutil.rmtree(reference, ignore_errors=True)
    run_to_end(reference, base / "warm-up.log")  # fills the compilation cache
    shutil.rmtree(reference)
    start = time.perf_counter()
    if run_to_end(reference, base / "reference.log") != 0:
        print(f"error: the reference run failed: see {base / 'reference.log'}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    ref_state = final_state(reference)
    print(f"reference run: {seconds:.1f} s in {reference}", flush=True)
    results = []
    for kind, count in (("kill", args.kills), ("corrupt", args.corruptions)):
        for i in range(count):
            r = trial(kind, i, base, reference, ref_state, seconds, rng)
            seconds = r["seconds"]  # shortened when a run ended before its kill
            results.append(r)
            delay = f"after {r['delay']:.1f} s" if r["delay"] is not None else ""
            delay += f" ({r['redrawn']} redrawn)" if r["redrawn"] else ""
            print(
                f"{r['trial']}: killed {delay} in {r['phase']}"
                + (f"; {r['damage']}" if r["damage"] else "")
                + ("; fell back" if r["fallback"] else "")
                + (": identical" if r["ok"] else f": FAILED ({'; '.join(r['problems'])})"),
                flush=True,
            )
    phases = Counter(r["phase"] for r in results if r["trial"].startswith("kill"))
    failed = [r for r in results if not r["ok"]]
    print(
        f"summary: {len(results) - len(failed)} of {len(results)} trials identical to the "
        f"straight run; kills by phase: {dict(sorted(phases.items()))}; "
        f"fallbacks: {sum(r['fallback'] for r in results)}; kills redrawn because the run had "
        f"already ended: {sum(r['redrawn'] for r in results)}; details in {base}"
    )
    (base / "results.json").write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
