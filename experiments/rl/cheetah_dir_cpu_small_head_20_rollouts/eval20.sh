#!/bin/bash
# The HalfCheetah-direction MAML run (1093 iterations) and the untrained initialisation on 100
# held-out tasks with 20 rollouts per inner step, the number the training stepped on.
cd /work/main
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
echo "start $(date '+%F %T') commit $(git rev-parse --short HEAD)"
python -m metalearn.evaluate /work/runs/chs2/maml --which latest eval.num_tasks=100 algorithm.eval_rollouts=20 --out /work/runs/chs2/maml/eval_latest_100_tasks_20_rollouts.json
echo "maml done $(date '+%F %T')"
python -m metalearn.train +experiment=rl_cheetah_dir_maml data.horizon=100 data.rollouts=20 \
  algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 \
  eval.num_tasks=100 eval.tasks_per_call=20 algorithm.eval_rollouts=20 model.head_init_scale=0.01 \
  trainer.meta_steps=0 name=rl_cheetah_dir_random_small_head_r20_100tasks_20_rollouts \
  hydra.run.dir=/work/runs/chs2/random_init_100_20_rollouts
echo "end $(date '+%F %T')"
