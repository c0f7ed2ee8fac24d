# Sourced at the start of every device call: the carried wheels, the repo on the path.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD TFDS_DATA_DIR=/tmp/tfds PYTHONUNBUFFERED=1
mkdir -p /tmp/runs
