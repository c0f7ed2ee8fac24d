#!/usr/bin/env bash
# The sinusoid study (the paper's setup, seeds 0-19) as one vectorized sweep and as two sweeps of
# processes, two at a time (one per core): with XLA:CPU's default threads, and with one thread
# each (the fastest process sweep in experiments/benchmarks/sweep.jsonl); in the same hour, from
# empty compilation caches. Writes timings.jsonl here and keeps each vectorized run's eval.json and summary.json.
#   bash experiments/sinusoid/vectorized_study/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
seeds=$(seq -s, 0 19)
now() { python -c 'import time; print(time.perf_counter())'; }

t0=$(now)
JAX_COMPILATION_CACHE_DIR="$work/cache_v" python -m metalearn.train -m +experiment=sinusoid_maml \
  "seed=$seeds" hydra/launcher=vectorized trainer.progress_bar=lines \
  hydra.sweep.dir="$work/vectorized" > "$work/vectorized.log" 2>&1
t1=$(now)
printf '%s\n' $(seq 0 19) | XLA_FLAGS=--xla_cpu_multi_thread_eigen=false \
  JAX_COMPILATION_CACHE_DIR="$work/cache_p" xargs -P 2 -I{} \
  python -m metalearn.train +experiment=sinusoid_maml seed={} trainer.progress_bar=lines \
  hydra.run.dir="$work/processes/{}" > "$work/processes.log" 2>&1
t2=$(now)
printf '%s\n' $(seq 0 19) | JAX_COMPILATION_CACHE_DIR="$work/cache_d" xargs -P 2 -I{} \
  python -m metalearn.train +experiment=sinusoid_maml seed={} trainer.progress_bar=lines \
  hydra.run.dir="$work/processes_default/{}" > "$work/processes_default.log" 2>&1
t3=$(now)

python - "$work" "$here" "$t0" "$t1" "$t2" "$t3" <<'PY'
import json, pathlib, platform, subprocess, sys
work, here = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
t0, t1, t2, t3 = map(float, sys.argv[3:])
best = min(t2 - t1, t3 - t2)
row = {"sweep": "sinusoid_maml seeds 0-19", "vectorized_s": round(t1 - t0, 1),
       "processes2t1_s": round(t2 - t1, 1), "processes2_s": round(t3 - t2, 1),
       "speedup_vs_best_processes": round(best / (t1 - t0), 3),
       "commit": subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip(),
       "device": f"cpu ({platform.machine()}), 2 cores"}
print(json.dumps(row))
with open(here / "timings.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
runs = here / "runs"
runs.mkdir(exist_ok=True)
for job in sorted((work / "vectorized").iterdir()):
    if job.is_dir() and (job / "eval.json").exists():
        seed = job.name.split("seed=")[1].split(",")[0]  # Hydra names it N_seed=N,...
        (runs / f"vectorized_seed={seed}").mkdir(exist_ok=True)
        for name in ("eval.json", "summary.json", "status.json"):
            (runs / f"vectorized_seed={seed}" / name).write_bytes((job / name).read_bytes())
for proc in sorted((work / "processes").iterdir(), key=lambda p: int(p.name)):
    (runs / f"process_seed={proc.name}").mkdir(exist_ok=True)
    (runs / f"process_seed={proc.name}" / "eval.json").write_bytes((proc / "eval.json").read_bytes())
    (runs / f"process_seed={proc.name}" / "summary.json").write_bytes((proc / "summary.json").read_bytes())
PY
