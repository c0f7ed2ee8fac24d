#!/bin/bash
# HalfCheetah direction, CPU-reduced, two XLA:CPU devices; $1 = trpo | ppo
OUTER=$1
cd /work/runs/chd
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
timeout -s INT 4800 python -m metalearn.train +experiment=rl_cheetah_dir_maml data.horizon=100 data.rollouts=10 \
    algorithm.post_rollouts=10 trainer.meta_batch_size=10 trainer.meta_steps=5000 \
    trainer.eval_every=100 eval.val_tasks=20 eval.num_tasks=40 eval.tasks_per_call=20 \
    algorithm.eval_rollouts=10 algorithm.outer=$OUTER name=rl_cheetah_dir_maml_$OUTER \
    hydra.run.dir=/work/runs/chd/$OUTER
rc=$?; echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
