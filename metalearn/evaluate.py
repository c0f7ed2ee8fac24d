"""Evaluate a saved checkpoint on its own: ``python -m metalearn.evaluate RUN_DIR``.

Reads ``RUN_DIR/config.yaml``, restores the best-on-validation parameters (or the latest
checkpoint with ``--which latest``, or when the run has no ``best/``: a warning says so), evaluates
on the test split and writes the records, in the ``eval.json`` format plus ``checkpoint`` (best or
latest) and ``checkpoint_step``, to ``RUN_DIR/eval_<best|latest>.json`` named after the checkpoint
actually evaluated (or ``--out``). Any evaluation setting can
be overridden as ``key=value`` (e.g. ``eval.num_tasks=1000``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from omegaconf import OmegaConf

from metalearn.config import to_objects
from metalearn.runner.evaluation import format_record
from metalearn.runner.loop import load_for_evaluation


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--which", choices=["best", "latest"], default="best")
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_intermixed_args(argv)
    config_path = os.path.join(args.run_dir, "config.yaml")
    if not os.path.exists(config_path):
        sys.exit(f"error: {config_path} not found: is {args.run_dir!r} a metalearn run directory?")
    cfg = OmegaConf.merge(OmegaConf.load(config_path), OmegaConf.from_dotlist(args.overrides))
    try:
        runner, meta_params = load_for_evaluation(to_objects(cfg), args.run_dir, args.which)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        sys.exit(f"error: {err}")
    try:
        records = runner.evaluate(meta_params, "test", runner.cfg.eval.num_tasks)
    finally:
        runner.close()
    print(f"evaluated the {runner.loaded} checkpoint (step {runner.loaded_step})")
    for r in records:
        r.update(checkpoint=runner.loaded, checkpoint_step=runner.loaded_step)
    out = args.out or os.path.join(args.run_dir, f"eval_{runner.loaded}.json")
    with open(out, "w") as f:
        json.dump(records, f, indent=2)
    for r in records:
        print(format_record(r))
    print(f"wrote {out}")
    return records


if __name__ == "__main__":
    main()
