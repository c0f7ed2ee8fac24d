#!/usr/bin/env bash
# Wheels of what a JAX + CUDA image without internet usually lacks (Hydra, TFDS and their needs;
# Brax and MuJoCo for the locomotion families; higher for scripts/bench.py's peer), for a
# machine that already has jax, jaxlib, flax, optax, orbax-checkpoint, numpy, scipy, etils,
# torch and the common scientific stack. Run here (with internet), then carry DIR there:
#   bash scripts/offline_wheels.sh .whl 3.12      # DIR, the target machine's Python version
#   source scripts/offline_setup.sh .whl          # there: installs into /tmp/site, sets paths
#                                                 # (and parallel-metalearn into /tmp/venv-pml)
# The versions are the ones that ran on a lent H200 (jax 0.11.2, Python 3.12) on 2026-11-27.
set -euo pipefail
dir=${1:-.whl}
python_version=${2:-3.12}
mkdir -p "$dir"
binary=(hydra-core==1.3.8 omegaconf==2.3.1 hydra-submitit-launcher==1.2.0 submitit==1.5.4
  tensorflow-datasets==4.9.10 array-record==0.8.6 dm-tree==0.1.10 immutabledict==4.3.1
  simple-parsing==0.1.9 docstring-parser==0.18.0 tensorflow-metadata==1.21.0
  googleapis-common-protos==1.76.0 termcolor==3.3.0 toml==0.10.2 tensorboardX==2.6.5
  brax==0.14.2 mujoco==4.0.0 mujoco-core==4.0.0 mujoco-mjx==3.17.0 jaxopt==0.8.5
  ml-collections==1.1.0 trimesh==5.2.0 flask==3.1.3 flask-cors==6.0.5 itsdangerous==2.2.0
  blinker==1.9.0 glfw==2.11.0 pyopengl==3.1.10 higher==0.2.1)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
  --python-version "$python_version" "${platforms[@]}" -d "$dir" "${binary[@]}"
# Published as source only: pure Python, so a wheel built here installs anywhere.
python3 -m pip wheel --quiet --no-deps -w "$dir" antlr4-python3-runtime==4.9.3 promise==2.3
# parallel-metalearn, scripts/bench.py's peer, kept apart in DIR/pml: its top-level package is
# named metalearn, like ours, so offline_setup.sh installs it into an environment of its own.
# Beyond torch it needs numpy>=2 (the machine's, which jax needs too) and tqdm (carried).
mkdir -p "$dir/pml"
python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
  --python-version "$python_version" "${platforms[@]}" -d "$dir/pml" \
  parallel-metalearn==0.5.6 tqdm==4.70.1
du -sh "$dir"
