#!/bin/bash
O="data.horizon=100 data.rollouts=10 algorithm.post_rollouts=10 trainer.meta_batch_size=10 trainer.meta_steps=500 trainer.eval_every=50 eval.val_tasks=20 eval.num_tasks=40 eval.tasks_per_call=20 algorithm.eval_rollouts=10"
echo "start $(date +%T) load $(cat /proc/loadavg)"
timeout -s INT 1800 python -m metalearn.train +experiment=rl_ant_dir_maml $O hydra.run.dir=/work/runs/ant/ant_dir_cpu
echo "train exit $? at $(date +%T)"
python -m metalearn.evaluate /work/runs/ant/ant_dir_cpu --which latest --out /work/runs/ant/ant_dir_cpu/eval_latest.json
python -m metalearn.evaluate /work/runs/ant/ant_dir_cpu --which best --out /work/runs/ant/ant_dir_cpu/eval_best.json
python -m metalearn.train +experiment=rl_ant_dir_maml $O trainer.meta_steps=0 name=rl_ant_dir_random hydra.run.dir=/work/runs/ant/ant_dir_cpu/random_init
echo "end $(date +%T) load $(cat /proc/loadavg)"
