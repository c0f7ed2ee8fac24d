"""SIGTERM/Ctrl-C anywhere end in one line and a resumable run; a sweep runs every job."""

import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from metalearn.runner.layout import saved_steps
from tests.cli import Watched, checkout_env, communicated, run_cli, run_tool

TINY = ["+experiment=sinusoid_maml", "+debug=tiny"]
ROOT = Path(__file__).resolve().parents[2]
# Long final evaluations (one task per call), so that a signal can land inside them.
SLOW_EVAL = [
    "trainer.eval_every=0",
    "eval.val_tasks=1500",
    "eval.num_tasks=1500",
    "eval.tasks_per_call=1",
]


def start(run_dir: Path | None, *overrides: str, cwd: Path = ROOT) -> subprocess.Popen:
    """The tiny sinusoid run in ``run_dir`` (None: Hydra's default, under ``cwd``)."""
    where = [f"hydra.run.dir={run_dir}"] if run_dir is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "metalearn.train", *TINY, *where, *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=checkout_env(),
    )


def signal_when(proc: subprocess.Popen, marker: str, signum: int) -> str:
    """Send ``signum`` as soon as a line containing ``marker`` is printed; all the output."""
    watched = Watched(proc)
    watched.wait_for_line(marker)
    proc.send_signal(signum)
    return watched.exit(f"{signal.Signals(signum).name} sent on the line {marker!r}")


def metrics_keys(run_dir: Path) -> list[tuple[int, str]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(json.loads(x)["step"], json.loads(x)["split"]) for x in lines]


@pytest.mark.parametrize(
    "signum, marker, phase",
    [
        (signal.SIGTERM, "validation on 1500 tasks at step 4", "the final validation"),
        (signal.SIGINT, "final evaluation on 1500 test tasks", "the final test evaluation"),
        (signal.SIGTERM, "training sinusoid_maml", "start-up|training|compilation"),
    ],
    ids=["sigterm-final-validation", "sigint-final-test", "sigterm-compile"],
)
def test_signal_anywhere_says_what_was_saved_and_resumes(tmp_path, signum, marker, phase):
    run_dir = tmp_path / "run"
    proc = start(run_dir, *SLOW_EVAL)
    output = signal_when(proc, marker, signum)
    assert proc.returncode == 128 + signum, output
    assert "Traceback" not in output, output
    hint = "rerun the same command with hydra.run.dir="
    stop_lines = [line for line in output.splitlines() if hint in line]
    assert len(stop_lines) == 1, output
    if "|" not in phase:
        assert f"interrupted by {signal.Signals(signum).name} during {phase}" in stop_lines[0]
        assert "the checkpoint of step 4 is saved" in stop_lines[0]
    else:
        saved = r"(nothing is saved yet|the checkpoint of step \d+ is saved)"
        assert re.search(rf"during ({phase}): {saved}; rerun", stop_lines[0]), stop_lines[0]
    assert not (run_dir / "eval.json").exists()
    resumed = start(run_dir, *SLOW_EVAL)
    out, _ = communicated(resumed, 300)
    assert resumed.returncode == 0 and "Traceback" not in out, out
    keys = metrics_keys(run_dir)
    assert sorted(keys) == sorted(set(keys)) == [(2, "train"), (4, "train"), (4, "val")]
    assert len(json.loads((run_dir / "eval.json").read_text())) == 3 * 2


# metalearn.train with two probes that change nothing it does. Python's exit handlers write
# EXIT_FILE: they run at a normal exit, which waits for an XLA compilation a signal interrupted
# (minutes), never at the exit a stop takes at once (os._exit). A thread writes COMPILING_FILE
# once the main thread is inside JAX's backend compilation of a training call.
PROBED_TRAIN = """
import atexit, runpy, sys, threading, time

exit_file, compiling_file = sys.argv[1:3]
atexit.register(lambda: open(exit_file, "w").write("Python's exit handlers ran\\n"))

def compiling_a_training_call():
    frame, names = sys._current_frames().get(threading.main_thread().ident), set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return {"train_call", "backend_compile_and_load"} <= names

def watch():
    while not compiling_a_training_call():
        time.sleep(0.01)
    open(compiling_file, "w").write("compiling\\n")

threading.Thread(target=watch, daemon=True).start()
sys.argv = [sys.argv[0], *sys.argv[3:]]
runpy.run_module("metalearn.train", run_name="__main__", alter_sys=True)
"""


class Probed:
    """A tiny sinusoid run under PROBED_TRAIN, in ``run_dir`` (None: Hydra's default, under
    ``cwd``), its probes' files in ``probes``, its persistent compilation cache in ``cache``
    (trainer.compilation_cache=auto reads it from the environment)."""

    def __init__(
        self, probes: Path, cache: Path, run_dir: Path | None, *overrides: str, cwd: Path = ROOT
    ):
        probes.mkdir()
        self.exit_file, self.compiling_file = probes / "exit-handlers-ran", probes / "compiling"
        where = [f"hydra.run.dir={run_dir}"] if run_dir is not None else []
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBED_TRAIN, str(self.exit_file), str(self.compiling_file)]
            + [*TINY, *where, *overrides],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=checkout_env({**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}),
        )
        self.watched = Watched(self.proc)

    def wait_for_the_compilation(self) -> None:
        """Until the main thread is inside the compilation of the first training call."""
        what = "the main thread inside the backend compilation of a training call"
        self.watched.wait_until(what, self.compiling_file.exists)


@pytest.mark.parametrize(
    "signals, sweep",
    [(["SIGTERM"], False), (["SIGINT", "SIGINT"], False), (["SIGTERM"], True)],
    ids=["once", "twice", "sweep"],
)
def test_a_signal_during_a_long_compilation_ends_the_run_at_once(tmp_path, signals, sweep):
    """300 unrolled inner steps compile for minutes (381 s measured on 2 cores). Compiling from
    the state last saved (here the seed's), a stop loses nothing: the run ends at once with its
    stop line. It waited for the compilation; a second signal printed the stop line and stayed
    alive until XLA had finished; so did a local sweep (its job recorded as interrupted). A
    second signal close behind the first ends it at once too, with one line or the other.

    "At once" is observed, not timed: the program was never compiled (no "compiled" line, and
    the persistent cache the run was given holds no training program, jit_run-*), and the
    process ended without Python's exit handlers, the exit that waits for XLA."""
    cache = tmp_path / "xla-cache"
    long_compile = ["algorithm.inner_steps=300", "algorithm.unroll=300"]
    probes = tmp_path / "probes"
    if sweep:
        run = Probed(probes, cache, None, "-m", "seed=0,1", *long_compile, cwd=tmp_path)
    else:
        run = Probed(probes, cache, tmp_path / "run", *long_compile)
    run.wait_for_the_compilation()
    for name in signals:  # a second one 10 ms after the first, while it is being handled
        run.proc.send_signal(getattr(signal, name))
        time.sleep(0.01)
    output = run.watched.exit(f"{' and '.join(signals)} sent during the compilation")
    assert run.proc.returncode == 128 + getattr(signal, signals[0]), output
    assert "compiled" not in output and "Traceback" not in output, output
    stored = sorted(p.name for p in cache.iterdir())  # the start-up's programs: the cache works
    assert stored and not [name for name in stored if name.startswith("jit_run-")], stored
    assert not run.exit_file.exists(), "the run took Python's normal exit:\n" + output
    stop = f"interrupted by {signals[0]} during compilation: nothing is saved yet; rerun the same"
    again = f"{signals[0]} again: exiting at once"  # the second landed before the stop line
    assert stop in output or (len(signals) == 2 and again in output), output
    if sweep:
        [sweep_dir] = (tmp_path / "multirun").glob("*/*")
        [job] = [p for p in sweep_dir.iterdir() if p.is_dir()]  # the sweep stopped at its first
        assert json.loads((job / "status.json").read_text())["status"] == "interrupted"
        assert not saved_steps(str(job)), output
    else:
        assert not saved_steps(str(tmp_path / "run")), output


def test_a_rerun_stopped_while_compiling_keeps_the_record_of_its_checkpoints(tmp_path):
    """A rerun with allowed changes records its config first; stopped while it compiles (at
    once, before any checkpoint of the new config), the record went on saying the new config,
    and a rerun with the run's own settings was refused as a different config."""
    run_dir, cache = tmp_path / "run", tmp_path / "xla-cache"
    first = Probed(tmp_path / "first", cache, run_dir)
    out = first.watched.exit("training")
    assert first.proc.returncode == 0, out
    # The probes see what they are there for: a compilation, and a normal exit.
    assert first.compiling_file.exists() and first.exit_file.exists(), out
    record = (run_dir / "config.yaml").read_text()
    changes = ["algorithm.inner_steps=300", "algorithm.unroll=300"]
    allowed = "trainer.allow_changes=[trainer.meta_steps,algorithm.inner_steps,algorithm.unroll]"
    rerun = Probed(tmp_path / "rerun", cache, run_dir, "trainer.meta_steps=8", *changes, allowed)
    rerun.wait_for_the_compilation()
    rerun.proc.send_signal(signal.SIGTERM)
    output = rerun.watched.exit("SIGTERM sent during the compilation")
    assert rerun.proc.returncode == 128 + signal.SIGTERM, output
    assert "during compilation: the checkpoint of step 4 is saved" in output, output
    assert not rerun.exit_file.exists(), "the run took Python's normal exit:\n" + output
    assert (run_dir / "config.yaml").read_text() == record
    again = start(run_dir)
    out, _ = communicated(again, 300)
    assert again.returncode == 0 and "different config" not in out, out


def hinted_override(output: str, command: str) -> str:
    """The override the stop line tells the user to rerun ``command`` with, as the shell reads
    it; exactly one such line."""
    hints = re.findall(rf"rerun the same {command} with (.+) to resume", output)
    assert len(hints) == 1, output
    words = shlex.split(hints[0])
    assert len(words) == 1, hints[0]
    return words[0]


def test_the_resume_hint_resumes_a_run_named_after_its_overrides(tmp_path):
    # Hydra names the directory outputs/sinusoid_maml-debug=tiny/<time>; the hint printed it
    # bare, and "hydra.run.dir=.../sinusoid_maml-debug=tiny/..." does not parse ("mismatched
    # input '='"), so the advertised command failed for every run named after an override.
    proc = start(None, *SLOW_EVAL, cwd=tmp_path)
    output = signal_when(proc, "final evaluation on 1500 test tasks", signal.SIGINT)
    assert proc.returncode == 130, output
    override = hinted_override(output, "command")
    [run_dir] = (tmp_path / "outputs").glob("*/*")
    assert "=" in run_dir.parent.name and override.endswith(f'"{run_dir}"'), override
    resumed = start(None, *SLOW_EVAL, override, cwd=tmp_path)
    out, _ = communicated(resumed, 300)
    assert resumed.returncode == 0 and "resumed from step 4" in out, out
    assert (run_dir / "eval.json").exists()
    assert len(list((tmp_path / "outputs").glob("*/*"))) == 1  # resumed there, not anew


def test_a_stopped_sweep_job_names_the_sweep_directory_to_rerun(tmp_path):
    # A sweep job's hint named its own directory with hydra.run.dir, which runs that one job
    # outside the sweep (and did not parse: "0_seed=0,..."); the sweep's directory resumes all.
    sweep = ["-m", *SLOW_EVAL, "seed=0,1"]
    proc = start(None, *sweep, cwd=tmp_path)
    output = signal_when(proc, "final evaluation on 1500 test tasks", signal.SIGINT)
    assert proc.returncode == 130, output
    override = hinted_override(output, "sweep command")
    [sweep_dir] = (tmp_path / "multirun").glob("*/*")
    assert override == f"hydra.sweep.dir={sweep_dir}", override
    resumed = start(None, *sweep, override, cwd=tmp_path)
    out, _ = communicated(resumed, 600)
    assert resumed.returncode == 0 and "resumed from step 4" in out, out
    assert sorted(p.name for p in sweep_dir.glob("*/eval.json")) == ["eval.json"] * 2


def tensorboard_scalars(run_dir: Path) -> list[tuple[str, int, float]]:
    """Every scalar of the run's TensorBoard event files (TFRecord framing read by hand)."""
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for path in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):  # length (8 bytes), its CRC (4), payload, payload CRC (4)
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            found += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return sorted(found)


def metrics_scalars(run_dir: Path) -> list[tuple[str, int, float]]:
    """The scalars metrics.jsonl holds, named as the README says TensorBoard shows them."""
    found = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record["step"]
        found += [
            (name, step, float(np.float32(value)))
            for name, value in record.items()
            if name != "step" and isinstance(value, (int, float))
        ]
        found += [
            (f"{record['split']}/{e['metric']}/shots{e['shots']}_steps{e['steps']}", step,
             float(np.float32(e["mean"])))
            for e in record.get("eval", [])
        ]  # fmt: skip
    return sorted(found)


def test_tensorboard_holds_what_metrics_jsonl_holds_after_a_kill_and_reruns(tmp_path):
    # SIGKILL left an empty event file (tensorboardX flushes every 2 minutes), and the resumed
    # writer's purge_step dropped everything up to the checkpoint: TensorBoard showed steps
    # 110-300 of a run whose metrics.jsonl had 10-300. A rerun of the finished run added a
    # second copy of the final validation.
    run_dir = tmp_path / "run"
    slow_validation = [
        "trainer.meta_steps=300",
        "trainer.log_every=10",
        "trainer.eval_every=100",
        "trainer.checkpoint_every=100",
        "eval.val_tasks=1500",
        "eval.tasks_per_call=1",
    ]
    proc = start(run_dir, *slow_validation)
    output = signal_when(proc, "validation on 1500 tasks at step 200", signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, output
    logged = metrics_scalars(run_dir)
    assert ("train/mse", 200) in {(tag, step) for tag, step, _ in logged}
    assert tensorboard_scalars(run_dir) == logged  # flushed as written
    for _ in range(2):  # resume from step 100; then rerun the finished run
        out, _ = communicated(start(run_dir, *slow_validation), 300)
        assert "Traceback" not in out and (run_dir / "eval.json").exists(), out
        scalars = tensorboard_scalars(run_dir)
        assert scalars == metrics_scalars(run_dir)
        assert len({(tag, step) for tag, step, _ in scalars}) == len(scalars)  # no duplicates
        assert {step for tag, step, _ in scalars if tag == "train/mse"} == set(range(10, 301, 10))


def test_sweep_runs_every_job_and_summarises_failures(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m", *TINY, "optimizer.lr=0.001,-1,1e30,0.002", f"hydra.sweep.dir={sweep_dir}"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    status = [json.loads((p / "status.json").read_text()) for p in jobs]
    assert [s["status"] for s in status] == ["ok", "failed", "failed", "ok"]
    assert "optimizer.lr must be > 0" in status[1]["message"]
    assert "non-finite" in status[2]["message"]
    assert all(
        (p / "eval.json").exists() == (s["status"] == "ok")
        for p, s in zip(jobs, status, strict=True)
    )
    summary = result.stderr[result.stderr.index("sweep: 2 of 4 job(s) succeeded") :]
    assert f"{jobs[1].name}: failed (exit 2): error: optimizer.lr must be > 0" in summary
    assert f"{jobs[2].name}: failed (exit 2): error: non-finite" in summary
    # collect_sweep lists the failed jobs and an unreadable eval.json instead of crashing.
    (jobs[3] / "eval.json").write_text('[{"metric": "mse", "me')
    table = run_tool("collect_sweep", str(sweep_dir))
    assert table.returncode == 0, table.stderr
    assert f"{jobs[3]}: unreadable eval.json" in table.stdout
    assert f"{jobs[1]}: failed: error: optimizer.lr must be > 0" in table.stdout
    assert len([line for line in table.stdout.splitlines() if line.startswith("0_")]) == 6


def test_a_rerun_sweep_reports_its_own_jobs_and_a_refusal_hides_no_result(tmp_path):
    # Rerun in the same sweep directory, the summary counted no job ("0 of 0"), exit 0, as
    # Hydra rewrites .hydra/ in place; and a job the run directory refused had its "ok" record
    # replaced by "failed", so collect_sweep dropped its intact eval.json.
    sweep_dir = tmp_path / "sweep"
    sweep = ["-m", *TINY, "optimizer.lr=0.001,1e30", f"hydra.sweep.dir={sweep_dir}"]
    assert run_cli(*sweep).returncode == 1
    time.sleep(1.5)  # past the summary's margin for coarse file times
    again = run_cli(*sweep)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "sweep: 1 of 2 job(s) succeeded" in again.stderr
    assert "1_optimizer.lr=1e+30: failed (exit 2): error: non-finite" in again.stderr
    time.sleep(1.5)
    other = ["+experiment=sinusoid_maml_k5", "+debug=tiny", "optimizer.lr=0.001"]
    refused = run_cli("-m", *other, f"hydra.sweep.dir={sweep_dir}")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "sweep: 0 of 1 job(s) succeeded" in refused.stderr
    assert "0_optimizer.lr=0.001: refused (exit 2): error: " in refused.stderr
    record = json.loads((sweep_dir / "0_optimizer.lr=0.001" / "status.json").read_text())
    assert record["status"] == "refused" and record["previous"]["status"] == "ok"
    table = run_tool("collect_sweep", str(sweep_dir))
    assert table.returncode == 0, table.stderr
    assert any(line.startswith("0_optimizer.lr=0.001  ") for line in table.stdout.splitlines())


def test_a_run_and_a_sweep_never_share_a_directory(tmp_path):
    # A run in a sweep's directory was tabulated by collect_sweep beside its jobs; a sweep in a
    # run's directory put its jobs inside the run. Both ran with exit 0.
    sweep = tmp_path / "sweep"
    made = run_cli("-m", *TINY, "seed=0", f"hydra.sweep.dir={sweep}")
    assert made.returncode == 0, made.stderr[-2000:]
    before = sorted(p.name for p in sweep.iterdir())
    result = run_cli(*TINY, f"hydra.run.dir={sweep}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: hydra.run.dir={sweep} is a sweep's directory (multirun.yaml): a run there would "
        "be taken for one of its jobs. Nothing was written. Choose another hydra.run.dir"
    ]
    assert sorted(p.name for p in sweep.iterdir()) == before
    job = tmp_path / "job"
    next(p for p in sweep.iterdir() if p.is_dir() and p.name != ".hydra").rename(job)
    result = run_cli("-m", *TINY, "seed=1", f"hydra.sweep.dir={job}")
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: hydra.sweep.dir={job} holds a run (config.yaml, .hydra, ")
    assert not (job / "multirun.yaml").exists()
