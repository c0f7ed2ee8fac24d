# Sourced by run.sh, resume.sh and pretrained_run.sh: the run directory's parent, two XLA:CPU
# devices, and the CPU-reduced settings every HalfCheetah-velocity run here shares.
cd /work/runs/cvs || exit 1
export JAX_NUM_CPU_DEVICES=2 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
COMMON="+experiment=rl_cheetah_vel_maml data.horizon=100 data.rollouts=20 algorithm.post_rollouts=20 trainer.meta_batch_size=10 trainer.eval_every=100 eval.val_tasks=20 eval.num_tasks=100 eval.tasks_per_call=20 algorithm.eval_rollouts=20 model.head_init_scale=0.01 eval.select_best=false trainer.progress_bar=lines"
