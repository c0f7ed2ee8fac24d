#!/bin/bash
# Finn et al.'s "pretrained" baseline for the CPU-reduced Ant-direction run: the same settings as
# the MAML run (small head, 10 tasks x (20 + 20) rollouts, horizon 100, one XLA:CPU device) with
# no inner step in training (algorithm.inner_steps=0), as many iterations (STEPS, MAML's 1000),
# and the final test on the latest parameters over 100 held-out tasks with 20 rollouts per inner
# step, as MAML's.
source "$(dirname "$0")/settings.sh"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
timeout -s INT ${BUDGET:-7200} python -m metalearn.train $COMMON algorithm.inner_steps=0 trainer.meta_steps=${STEPS:-1000} name=rl_ant_dir_pretrained_small_head_r20 hydra.run.dir=/work/runs/ads/pretrained
rc=$?; echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
