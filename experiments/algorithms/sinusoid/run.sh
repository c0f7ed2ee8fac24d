#!/bin/bash
# The per-algorithm sinusoid table of ../README.md, re-run with its records: each algorithm on
# the top-level config (python -m metalearn.train algorithm=NAME: seed 0, 70,000 meta-steps,
# 600 test tasks), its run directory under RUNS, and config.yaml, eval.json, summary.json copied
# here into one folder per row. iMAML is also evaluated after its own 20 inner steps.
RUNS=${RUNS:-/work/runs/algos}
HERE=$(cd "$(dirname "$0")" && pwd)
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C "$HERE" rev-parse --short HEAD)"
run() {  # NAME OVERRIDES...
    local name=$1; shift
    python -m metalearn.train "$@" trainer.progress_bar=lines hydra.run.dir="$RUNS/$name" > "$RUNS/$name.log" 2>&1
    local rc=$?
    mkdir -p "$HERE/$name" && cp "$RUNS/$name"/{config.yaml,eval.json,summary.json} "$HERE/$name/"
    echo "$name done $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
}
mkdir -p "$RUNS"
run maml algorithm=maml
run fomaml algorithm=fomaml
run reptile_sgd_cosine algorithm=reptile optimizer=sgd optimizer.lr=1.0 optimizer.schedule=cosine
run reptile_adam algorithm=reptile
run anil algorithm=anil
run meta_sgd algorithm=meta_sgd
run mamlpp algorithm=mamlpp optimizer=adam_cosine optimizer.final_lr_fraction=0.01
run imaml algorithm=imaml
python -m metalearn.evaluate "$RUNS/imaml" "eval.steps=[0,1,5,10,20]" "eval.shots=[10]" \
    --out "$HERE/imaml/eval_20_steps.json" > "$RUNS/imaml_eval.log" 2>&1
echo "end $(date '+%F %T') rc $? load $(cut -d' ' -f1-3 /proc/loadavg)"
