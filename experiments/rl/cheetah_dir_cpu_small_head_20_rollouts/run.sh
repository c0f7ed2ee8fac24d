#!/bin/bash
# HalfCheetah direction, CPU-reduced, two XLA:CPU devices, mean layer started at 0.01 x Glorot,
# 20 rollouts per inner step and 20 after it (the paper's per-task sampling), 10 tasks, horizon 100
cd /work/runs/chs2
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
COMMON="+experiment=rl_cheetah_dir_maml data.horizon=100 data.rollouts=20 algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 eval.num_tasks=40 eval.tasks_per_call=20 algorithm.eval_rollouts=10 model.head_init_scale=0.01"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
python -m metalearn.train $COMMON trainer.meta_steps=0 name=rl_cheetah_dir_random_small_head_r20 hydra.run.dir=/work/runs/chs2/random_init
echo "random init done $(date '+%F %T')"
timeout -s INT 6000 python -m metalearn.train $COMMON trainer.meta_steps=5000 name=rl_cheetah_dir_maml_small_head_r20 hydra.run.dir=/work/runs/chs2/maml
rc=$?; echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
