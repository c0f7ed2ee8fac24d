# Sourced by run.sh: the run directory's parent and the CPU-reduced settings that made
# HalfCheetah direction and velocity adapt (small head, 10 tasks x (20 + 20) rollouts, horizon
# 100), applied to Ant direction. One XLA:CPU device: on two (JAX_NUM_CPU_DEVICES=2, as the
# HalfCheetah runs) the first attempt hung in its first iteration in the physics' batched
# triangular solve (gdb: lapack_strsm_ffi -> ParallelBatchMap -> BlockingCounter::Wait), as
# experiments/rl/locomotion/README.md warns.
cd /work/runs/ads || exit 1
COMMON="+experiment=rl_ant_dir_maml data.horizon=100 data.rollouts=20 algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 eval.num_tasks=100 eval.tasks_per_call=20 algorithm.eval_rollouts=20 model.head_init_scale=0.01 eval.select_best=false trainer.progress_bar=lines"
