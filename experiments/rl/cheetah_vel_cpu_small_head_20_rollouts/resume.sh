#!/bin/bash
# Resume the HalfCheetah-velocity MAML run (400 iterations) to STEPS iterations, same settings.
source "$(dirname "$0")/settings.sh"
echo "start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) commit $(git -C /work/main rev-parse --short HEAD)"
timeout -s INT ${BUDGET:-4800} python -m metalearn.train $COMMON trainer.meta_steps=${STEPS:-1200} "trainer.allow_changes=[trainer.meta_steps]" name=rl_cheetah_vel_maml_small_head_r20 hydra.run.dir=/work/runs/cvs/maml
rc=$?; echo "end $(date '+%F %T') rc $rc load $(cut -d' ' -f1-3 /proc/loadavg)"
