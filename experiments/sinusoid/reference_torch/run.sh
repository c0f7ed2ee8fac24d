#!/bin/bash
# The independent PyTorch MAML (scripts/reference_sinusoid_torch.py) on the seeds in SEEDS
# (default 0-9; the records' 10-19 were run with SEEDS="10 11 ... 19"), 70,000
# meta-iterations each, one after the other on one thread; records seed_N.json beside this file.
cd "$(dirname "$0")" || exit 1
for seed in ${SEEDS:-0 1 2 3 4 5 6 7 8 9}; do
  echo "seed $seed start $(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)"
  python ../../../scripts/reference_sinusoid_torch.py --seed "$seed" --threads 1 --json "seed_$seed.json" || exit 1
done
echo "end $(date '+%F %T')"
