#!/bin/bash
# A second training seed of ../run.sh's HalfCheetah-direction MAML run (seed=1, nothing else
# changed), stopped by SIGINT after BUDGET seconds (its checkpoint is kept), then tested as
# ../eval20.sh tests seed 0: the latest parameters and seed 1's untrained initialisation on 100
# held-out tasks with 20 rollouts per inner step. RUNS: where the run directories go.
RUNS=${RUNS:-/work/runs/chd_seed1}
BUDGET=${BUDGET:-5700}
mkdir -p "$RUNS" && cd "$RUNS" || exit 1
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
COMMON="+experiment=rl_cheetah_dir_maml data.horizon=100 data.rollouts=20 algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 eval.num_tasks=40 eval.tasks_per_call=20 algorithm.eval_rollouts=10 model.head_init_scale=0.01 seed=1"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
timeout -s INT "$BUDGET" python -m metalearn.train $COMMON trainer.meta_steps=5000 name=rl_cheetah_dir_maml_small_head_r20_seed1 hydra.run.dir="$RUNS/maml"
rc=$?; echo "training end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
python -m metalearn.evaluate "$RUNS/maml" --which latest eval.num_tasks=100 algorithm.eval_rollouts=20 --out "$RUNS/maml/eval_latest_100_tasks_20_rollouts.json"
echo "maml evaluated $(date '+%F %T')"
python -m metalearn.train $COMMON eval.num_tasks=100 algorithm.eval_rollouts=20 trainer.meta_steps=0 name=rl_cheetah_dir_random_small_head_r20_100tasks_20_rollouts_seed1 hydra.run.dir="$RUNS/random_init_100_tasks_20_rollouts"
echo "end $(date '+%F %T')"
