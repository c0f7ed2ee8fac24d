#!/bin/bash
# HalfCheetah direction and velocity, MAML-RL at the paper's batch (40 tasks x 20 + 20 rollouts,
# horizon 200), both trained side by side on one lent GPU for TRAIN_S seconds, stopped by SIGTERM
# (each saves its checkpoint), then each run's latest parameters tested on the held-out tasks its untrained
# initialisation was tested on while it trained. One device call, from the repository root:
#   source scripts/offline_setup.sh .whl; bash experiments/rl/cheetah_gpu/run.sh
# EXTRA / EVAL_EXTRA add overrides (a CPU dry run shrinks the sizes with them).
# A later call continues the same two runs: RESUME_FROM=experiments/rl/cheetah_gpu copies their
# run directories (checkpoints included) into $RUNS first; a tested initialisation is not retested.
set -u
RUNS=${RUNS:-/tmp/runs}
TRAIN_S=${TRAIN_S:-360}
EVAL_S=${EVAL_S:-150}
EXTRA=${EXTRA:-}
EVAL_EXTRA=${EVAL_EXTRA:-eval.num_tasks=100 eval.tasks_per_call=100}
mkdir -p "$RUNS"
[ -n "${RESUME_FROM:-}" ] && cp -r "$RESUME_FROM/cheetah_dir" "$RESUME_FROM/cheetah_vel" "$RUNS/"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.2}
{ date -u; echo "commit ${COMMIT:-unknown}"; nvidia-smi -L 2>&1; python3 -c "import jax; print(jax.__version__, jax.devices())"; } > "$RUNS/device.txt" 2>&1
SECONDS=0
pids=()
for family in dir vel; do
  python3 -m metalearn.train +experiment=rl_cheetah_${family}_maml \
    hydra.run.dir="$RUNS/cheetah_$family" trainer.eval_every=0 $EXTRA \
    > "$RUNS/train_cheetah_$family.log" 2>&1 &
  pids+=($!)
done
# The untrained initialisations are tested while the runs train (same held-out tasks).
sleep 30
for family in dir vel; do
  [ -e "$RUNS/cheetah_$family/eval_init.json" ] && continue
  timeout $((TRAIN_S + EVAL_S - 30)) python3 -m metalearn.evaluate "$RUNS/cheetah_$family" \
    --which init $EVAL_EXTRA > "$RUNS/eval_cheetah_${family}_init.log" 2>&1 &
done
# Train until TRAIN_S seconds have passed, or until both runs have ended (a failure).
any_alive() { for pid; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
while [ $SECONDS -lt "$TRAIN_S" ] && any_alive "${pids[@]}"; do sleep 2; done
echo "SIGTERM at $(date -u)" >> "$RUNS/device.txt"
kill -TERM "${pids[@]}" 2>/dev/null
wait "${pids[@]}"
for family in dir vel; do
  timeout "$EVAL_S" python3 -m metalearn.evaluate "$RUNS/cheetah_$family" --which latest \
    $EVAL_EXTRA > "$RUNS/eval_cheetah_${family}_latest.log" 2>&1 &
done
wait
echo "done at $(date -u)" >> "$RUNS/device.txt"
[ -n "${OUT:-}" ] && tar czf "$OUT/cheetah_gpu.tgz" -C "$RUNS" .
exit 0
