#!/bin/bash
# Finn et al.'s "pretrained" baseline for the CPU-reduced HalfCheetah-velocity run: the same
# settings as the MAML run (small head, 10 tasks x (20 + 20) rollouts, horizon 100) with no inner
# step in training (algorithm.inner_steps=0), as many iterations (STEPS, MAML's), and the final
# test on the latest parameters over 100 held-out tasks with 20 rollouts per inner step, as MAML's.
# Run again with a larger STEPS, it resumes the run from its latest checkpoint (allow_changes).
source "$(dirname "$0")/settings.sh"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
python -m metalearn.train $COMMON algorithm.inner_steps=0 trainer.meta_steps=${STEPS:-1200} "trainer.allow_changes=[trainer.meta_steps]" name=rl_cheetah_vel_pretrained_small_head_r20 hydra.run.dir=/work/runs/cvs/pretrained
rc=$?; echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
