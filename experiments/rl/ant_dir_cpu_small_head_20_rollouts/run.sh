#!/bin/bash
# Ant direction, CPU-reduced as the HalfCheetah runs that adapted: small head (0.01 x Glorot),
# 10 tasks x (20 + 20) rollouts, horizon 100, one XLA:CPU device; the untrained initialisation
# first, then MAML for STEPS iterations within BUDGET seconds (stopped by SIGINT: the checkpoint
# is saved, evaluate it with --which latest), each tested on the latest parameters over 100
# held-out tasks with 20 rollouts per inner step.
source "$(dirname "$0")/settings.sh"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
python -m metalearn.train $COMMON trainer.meta_steps=0 name=rl_ant_dir_random_small_head_r20 hydra.run.dir=/work/runs/ads/random_init
echo "random init done $(date '+%F %T')"
timeout -s INT ${BUDGET:-7200} python -m metalearn.train $COMMON trainer.meta_steps=${STEPS:-1000} name=rl_ant_dir_maml_small_head_r20 hydra.run.dir=/work/runs/ads/maml
rc=$?; echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
