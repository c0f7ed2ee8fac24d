#!/bin/bash
# After run.sh (RUN: its maml/ directory): the direction-speed probe on the latest and best
# checkpoints, then the latest checkpoint and the untrained initialisation on 100 test tasks.
cd "$(git rev-parse --show-toplevel)"
for w in init latest best; do
  python experiments/rl/cheetah_dir_cpu_small_head_20_rollouts/probes/direction_speed.py "$RUN" $w 40
done
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
python -m metalearn.evaluate "$RUN" --which latest eval.num_tasks=100
python -m metalearn.train +experiment=rl_cheetah_dir_maml data.horizon=100 data.rollouts=20 \
  algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 \
  eval.num_tasks=100 eval.tasks_per_call=20 algorithm.eval_rollouts=10 model.head_init_scale=0.01 \
  trainer.meta_steps=0 name=rl_cheetah_dir_random_small_head_r20_100tasks \
  hydra.run.dir="$(dirname "$RUN")/random_init_100"
