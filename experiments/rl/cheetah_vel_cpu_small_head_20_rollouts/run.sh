#!/bin/bash
# HalfCheetah velocity, CPU-reduced as the direction run that adapted: small head (0.01 x Glorot),
# 10 tasks x (20 + 20) rollouts, horizon 100, two XLA:CPU devices; the untrained initialisation
# first, then MAML for as many iterations as the session leaves (STEPS), each tested on the
# latest parameters over 100 held-out tasks with 20 rollouts per inner step.
source "$(dirname "$0")/settings.sh"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
python -m metalearn.train $COMMON trainer.meta_steps=0 name=rl_cheetah_vel_random_small_head_r20 hydra.run.dir=/work/runs/cvs/random_init
echo "random init done $(date '+%F %T')"
timeout -s INT ${BUDGET:-2700} python -m metalearn.train $COMMON trainer.meta_steps=${STEPS:-400} name=rl_cheetah_vel_maml_small_head_r20 hydra.run.dir=/work/runs/cvs/maml
rc=$?; echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
