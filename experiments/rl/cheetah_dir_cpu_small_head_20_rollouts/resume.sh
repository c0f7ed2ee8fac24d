#!/bin/bash
# run.sh's MAML run resumed from its checkpoint (step 839) for 25 more minutes
cd "$(dirname "$RUN")"
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
COMMON="+experiment=rl_cheetah_dir_maml data.horizon=100 data.rollouts=20 algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 eval.num_tasks=40 eval.tasks_per_call=20 algorithm.eval_rollouts=10 model.head_init_scale=0.01"
echo "start $(date '+%F %T') commit $(git -C /work/main rev-parse --short HEAD)"
timeout -s INT 1500 python -m metalearn.train $COMMON trainer.meta_steps=5000 name=rl_cheetah_dir_maml_small_head_r20 hydra.run.dir=RUN
rc=$?; echo "end $(date '+%F %T') rc $rc"
python -m metalearn.evaluate RUN --which latest eval.num_tasks=100 > eval_resumed_100.out 2>&1
echo "eval end $(date '+%F %T')"
