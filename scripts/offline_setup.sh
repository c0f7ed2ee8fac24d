# Sourced on a machine without internet, from the repository root, after
# scripts/offline_wheels.sh filled DIR (default .whl): installs the wheels into /tmp/site and
# puts it and the checkout on the Python path.
#   source scripts/offline_setup.sh .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "${1:-.whl}"/*.whl >/tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; return 1 2>/dev/null || exit 1; }
export PYTHONPATH=/tmp/site:$PWD TFDS_DATA_DIR=${TFDS_DATA_DIR:-/tmp/tfds} PYTHONUNBUFFERED=1
mkdir -p /tmp/runs
