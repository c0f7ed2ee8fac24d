#!/bin/bash
# Finn et al.'s "pretrained" baseline for the seed-1 HalfCheetah-direction run (./run.sh): the
# same settings and seed with no inner step in training (algorithm.inner_steps=0), as many
# iterations as the MAML run made (1064), and the final test on the latest parameters over the
# same 100 held-out tasks with 20 rollouts per inner step. RUNS: where the run directory goes.
RUNS=${RUNS:-/work/runs/chd_seed1}
mkdir -p "$RUNS" && cd "$RUNS" || exit 1
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
COMMON="+experiment=rl_cheetah_dir_maml data.horizon=100 data.rollouts=20 algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 eval.num_tasks=100 eval.tasks_per_call=20 algorithm.eval_rollouts=20 model.head_init_scale=0.01 seed=1"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
python -m metalearn.train $COMMON algorithm.inner_steps=0 trainer.meta_steps=1064 eval.select_best=false trainer.progress_bar=lines name=rl_cheetah_dir_pretrained_small_head_r20_seed1 hydra.run.dir="$RUNS/pretrained"
rc=$?
echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
