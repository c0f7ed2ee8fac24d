"""The task axis sharded over several devices, and two processes joined by jax.distributed.

Each run is a subprocess, since the number of CPU devices is fixed when JAX starts.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests.cli import checkout_env, communicated
from tests.conftest import restore_latest_state

TINY = [
    "+experiment=sinusoid_maml",
    "+debug=tiny",
    "trainer.meta_batch_size=4",
    "trainer.meta_steps=6",
    "trainer.steps_per_call=1",
]


def train(run_dir, *overrides, devices=1, timeout=240):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices)}
    return subprocess.Popen(
        [sys.executable, "-m", "metalearn.train", *TINY, *overrides, f"hydra.run.dir={run_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=checkout_env(env),
    )


def finish(proc, timeout=240):
    output, _ = communicated(proc, timeout)
    assert proc.returncode == 0, output
    return output


def assert_same_training(a, b):
    assert int(a.step) == int(b.step) == 6
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6)


def test_tasks_sharded_over_four_devices_give_the_one_device_update(tmp_path):
    single = train(tmp_path / "one")
    output = finish(train(tmp_path / "four", devices=4))
    finish(single)
    assert "4 cpu device(s)" in output
    assert_same_training(
        restore_latest_state(str(tmp_path / "one")), restore_latest_state(str(tmp_path / "four"))
    )


def test_meta_batch_must_divide_over_devices(tmp_path):
    proc = train(tmp_path / "bad", "trainer.meta_batch_size=6", devices=4)
    output, _ = communicated(proc, 120)
    assert proc.returncode == 2
    assert "trainer.meta_batch_size (6) must be a multiple of the number of devices (4)" in output


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_on_localhost_train_like_one(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    procs = [
        train(
            tmp_path / "two",
            "distributed.enabled=true",
            f"distributed.coordinator_address={address}",
            "distributed.num_processes=2",
            f"distributed.process_id={i}",
            devices=1,
        )
        for i in range(2)
    ]
    outputs = [finish(p) for p in procs]
    assert "2 cpu device(s)" in outputs[0]
    single = train(tmp_path / "one")
    finish(single)
    assert_same_training(
        restore_latest_state(str(tmp_path / "one")), restore_latest_state(str(tmp_path / "two"))
    )
    assert (tmp_path / "two" / "eval.json").exists()


# Long enough to signal one process while the pair trains, past step 200: 600 meta-steps, 5 per
# call (a step of the pair takes about 8 ms alone, so a stop lands 300 steps before the end).
LONGER = ["trainer.meta_steps=600", "trainer.steps_per_call=5", "trainer.log_every=50"]
LONGER += ["trainer.checkpoint_every=600", "trainer.eval_every=0"]


def distributed_pair(run_dir) -> list[subprocess.Popen]:
    """Two processes of one distributed run (localhost), training LONGER in ``run_dir``."""
    address = f"127.0.0.1:{free_port()}"
    distributed = ["distributed.enabled=true", f"distributed.coordinator_address={address}"]
    distributed += ["distributed.num_processes=2"]
    return [train(run_dir, *LONGER, *distributed, f"distributed.process_id={i}") for i in range(2)]


@pytest.mark.parametrize("when", ["training", "compilation"])
def test_a_signal_to_one_process_of_a_distributed_run_stops_every_process_at_one_step(
    tmp_path, when
):
    """One process stopped to save a checkpoint (a collective the other never joined): the
    run hung until killed, with nothing saved. Signalled while it compiled its first call, it
    ended at once, alone, and the other failed in the call's collectives. Now both stop after
    the same step, save it, and the pair resumes from it."""
    run_dir = tmp_path / "run"
    first = distributed_pair(run_dir)
    try:
        if when == "training":
            limit_s = 300  # a safety limit only
            deadline = time.monotonic() + limit_s
            while not logged_beyond(run_dir, 200):
                ended = first[0].poll()
                assert ended is None, f"process 0 ended (exit {ended}) before step 200 was logged"
                assert time.monotonic() < deadline, (
                    f"waited {limit_s} s for a record past step 200 in {run_dir}/metrics.jsonl"
                )
                time.sleep(0.1)
            head = ""
        else:  # as soon as the second process starts its training loop: it compiles
            head = "".join(line for line in until(first[1], "training sinusoid_maml"))
        first[1].send_signal(signal.SIGTERM)  # the second process only
        outputs = [communicated(p, 120)[0] for p in first]
    finally:  # hung, they would hold both cores for the rest of the tests
        for p in first:
            p.kill()
    outputs[1] = head + outputs[1]
    assert [p.returncode for p in first] == [143, 143], outputs
    stops = [re.findall(r"stopped at step (\d+); checkpoint saved", out) for out in outputs]
    assert stops[0] == stops[1] and len(stops[0]) == 1, outputs
    assert "another process of the run received SIGTERM" in outputs[0]
    assert (run_dir / "checkpoints" / stops[0][0]).is_dir()
    resumed = [finish(p) for p in distributed_pair(run_dir)]
    assert f"resumed from step {stops[0][0]} " in resumed[0]
    assert (run_dir / "eval.json").exists()


def until(proc: subprocess.Popen, marker: str):
    """The lines ``proc`` prints, up to and including the first that contains ``marker``."""
    for line in proc.stdout:
        yield line
        if marker in line:
            return


def logged_beyond(run_dir, step: int) -> bool:
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return any(json.loads(x)["step"] >= step for x in lines[:-1])  # the last may be half-written
