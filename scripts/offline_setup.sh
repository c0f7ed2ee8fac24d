# Sourced on a machine without internet, from the repository root, after
# scripts/offline_wheels.sh filled DIR (default .whl): installs the wheels into /tmp/site and
# puts it and the checkout on the Python path.
#   source scripts/offline_setup.sh .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "${1:-.whl}"/*.whl >/tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; return 1 2>/dev/null || exit 1; }
export PYTHONPATH=/tmp/site:$PWD TFDS_DATA_DIR=${TFDS_DATA_DIR:-/tmp/tfds} PYTHONUNBUFFERED=1
mkdir -p /tmp/runs
# parallel-metalearn (scripts/bench.py --impl parallel_metalearn), when DIR/pml holds it: its
# top-level package is named metalearn, so in /tmp/site it would shadow this checkout's. It goes
# into a virtual environment of its own instead (PML_VENV, default /tmp/venv-pml), made with
# --system-site-packages for the machine's torch and numpy; a venv's own site-packages come
# before the system's, and bench.py starts that interpreter without PYTHONPATH (so neither
# /tmp/site nor the checkout is on its path). BENCH_PML_PYTHON tells bench.py where it is.
if compgen -G "${1:-.whl}/pml/*.whl" >/dev/null; then
  pml_venv=${PML_VENV:-/tmp/venv-pml}
  python3 -m venv --system-site-packages --without-pip "$pml_venv"
  PYTHONPATH= "$pml_venv/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir \
    "${1:-.whl}"/pml/*.whl >>/tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; return 1 2>/dev/null || exit 1; }
  export BENCH_PML_PYTHON=$pml_venv/bin/python
fi
