"""StopRequest's signal handler, called directly where a real signal could land."""

from __future__ import annotations

import gc
import io
import logging
import signal
import sys
import time

import jax
import pytest

from metalearn import evaluate
from metalearn.config import to_objects
from metalearn.runner import loop
from metalearn.runner.run import Runner
from metalearn.runner.signals import (
    Interrupted,
    StopRequest,
    hand_back_to_launcher,
    interruption_behind,
)
from tests.cli import checkout_env, finished
from tests.conftest import compose_config, copy_of


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_inside_a_gc_callback_is_raised_after_the_callback():
    # Seen in the SIGTERM-during-compilation test: the signal landed in JAX's garbage-collection
    # callback, Interrupted was printed as "Exception ignored in: <function _xla_gc_callback>"
    # with a traceback, and dropped. Delivered again while the collector still ran (a loaded
    # machine), it landed in a weakref callback the collector called, and was dropped there.
    landed = []

    def callback(phase, info):
        if phase == "start" and not landed:
            landed.append(phase)
            stop._handle(signal.SIGTERM, sys._getframe())  # as if the signal arrived here

    with StopRequest() as stop:
        gc.callbacks.append(callback)
        try:
            with pytest.raises(Interrupted) as raised:
                gc.collect()
                time.sleep(5)  # the signal, delivered again, interrupts this
        finally:
            gc.callbacks.remove(callback)
    assert landed and raised.value.signum == signal.SIGTERM and stop.signum == signal.SIGTERM


def test_elsewhere_the_signal_raises_at_once():
    with StopRequest() as stop, pytest.raises(Interrupted):
        stop._handle(signal.SIGTERM, sys._getframe())


@pytest.mark.parametrize(
    "first, second", [("SIGUSR2", "SIGTERM"), ("SIGTERM", "SIGUSR2")], ids=["usr2", "pre-emption"]
)
def test_the_clusters_requeue_signal_and_sigterm_make_one_deferred_stop(monkeypatch, first, second):
    # A pre-emption sends SIGTERM and the requeue signal together (SLURM, in either order): the
    # second is not an impatient user's, and must not interrupt the step the first lets finish.
    monkeypatch.setenv("SUBMITIT_FOLDER", "/nowhere")  # as in a submitit job
    with StopRequest() as stop, stop.deferred():
        stop._handle(getattr(signal, first), sys._getframe())
        stop._handle(getattr(signal, second), sys._getframe())  # returns: no Interrupted
    assert stop.signum == getattr(signal, first) and stop.requeue


def test_outside_a_submitit_job_sigusr2_is_not_taken_and_sigterm_twice_still_interrupts():
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGUSR2) is not stop._handle
        with stop.deferred():
            stop._handle(signal.SIGTERM, sys._getframe())
            with pytest.raises(Interrupted):
                stop._handle(signal.SIGTERM, sys._getframe())
    assert not stop.requeue


def test_the_requeue_signal_while_an_interruption_is_handled_does_not_end_the_process(
    monkeypatch,
):
    # Outside the training loop SIGTERM raises at once; the requeue signal behind it used to
    # be the "second signal" that ends the process with os._exit, before the job is requeued.
    monkeypatch.setenv("SUBMITIT_FOLDER", "/nowhere")
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGUSR2) == stop._handle
        with pytest.raises(Interrupted):
            stop._handle(signal.SIGTERM, sys._getframe())
        stop._handle(signal.SIGUSR2, sys._getframe())
    assert stop.requeue


class _OneWriterAtATime(io.StringIO):
    """A log stream that refuses a reentrant write, as a BufferedWriter does, and calls
    ``landing`` (a signal arriving) inside its first flush."""

    def __init__(self, landing):
        super().__init__()
        self.busy, self.landing = False, landing

    def flush(self):
        if self.busy:
            raise RuntimeError("reentrant call inside the log stream")
        self.busy = True
        try:
            landing, self.landing = self.landing, None
            if landing is not None:
                landing()
        finally:
            self.busy = False


def test_a_deferred_signal_landing_inside_a_log_write_is_logged_at_the_next_check():
    # CI: SIGTERM came while the training loop's progress line was being flushed to train.log;
    # the handler logged "received SIGTERM" from there, into the same stream, and the file's
    # BufferedWriter raised "reentrant call" (printed as a logging error with a traceback).
    log = logging.getLogger("metalearn")
    with StopRequest() as stop, stop.deferred():
        stream = _OneWriterAtATime(lambda: stop._handle(signal.SIGTERM, sys._getframe()))
        handler = logging.StreamHandler(stream)
        handler.handleError = lambda record: pytest.fail("the log stream failed")
        log.addHandler(handler)
        try:
            log.warning("step 150/200")  # the signal lands inside this line's flush
            assert stop.signum == signal.SIGTERM and "received" not in stream.getvalue()
            assert stop.agreed()
            assert stop.agreed()  # said once
        finally:
            log.removeHandler(handler)
    received = "received SIGTERM: stopping after the current step and saving a checkpoint"
    assert stream.getvalue().splitlines() == ["step 150/200", received]


def _compare_pytrees_as_the_signal_lands(handler) -> None:
    """Compare two pytrees whose metadata comparison is where the signal ``handler`` is called
    (as if it arrived there), as JAX compares a flax module's static fields."""

    class Metadata:
        def __eq__(self, other):
            handler(signal.SIGINT, sys._getframe())
            return True

        def __hash__(self):
            return 0

    @jax.tree_util.register_pytree_node_class
    class Node:
        def tree_flatten(self):
            return (), Metadata()

        @classmethod
        def tree_unflatten(cls, metadata, children):
            return cls()

    _ = jax.tree_util.tree_structure(Node()) == jax.tree_util.tree_structure(Node())


def test_an_interrupted_that_jax_turns_into_its_own_error_is_still_the_interruption():
    # CI: SIGINT during the final evaluation landed in a pytree's metadata comparison, which
    # JAX runs in C++; JAX raised "ValueError: Exception raised while checking equality of
    # metadata fields of pytree", and the run ended as a failure (exit 2), not interrupted.
    with StopRequest() as stop:
        with pytest.raises(ValueError, match="equality of metadata") as raised:
            _compare_pytrees_as_the_signal_lands(stop._handle)
        behind = interruption_behind(raised.value)
        assert behind is stop.raised and behind.signum == signal.SIGINT
    # Outside a StopRequest (or under one no signal came to), an error is only itself.
    assert interruption_behind(raised.value) is None
    with StopRequest():
        assert interruption_behind(ValueError("a real error")) is None


def test_a_run_whose_interruption_jax_turned_into_an_error_ends_interrupted(
    tmp_path, monkeypatch, caplog
):
    def evaluation_where_the_signal_lands(runs, state):
        _compare_pytrees_as_the_signal_lands(signal.getsignal(signal.SIGINT))

    monkeypatch.setattr(loop, "_final_evaluation", evaluation_where_the_signal_lands)
    cfg = to_objects(compose_config(["+experiment=sinusoid_maml", "+debug=tiny"]))
    summary = loop.train_and_evaluate(cfg, str(tmp_path / "run"))
    assert summary["interrupted"] and summary["signal"] == signal.SIGINT, summary
    assert summary["step"] == 4  # the last checkpoint's, saved before the final evaluation
    said = "interrupted by SIGINT during the final test evaluation: the checkpoint of step 4"
    assert said in caplog.text, caplog.text


def test_evaluate_reports_such_an_interruption_as_the_interruption(
    finished_tiny_run, tmp_path, monkeypatch
):
    # Its __main__ ends an Interrupted with "interrupted by SIGINT: nothing was written".
    def evaluation_where_the_signal_lands(self, *args, **kwargs):
        _compare_pytrees_as_the_signal_lands(signal.getsignal(signal.SIGINT))

    monkeypatch.setattr(Runner, "evaluate", evaluation_where_the_signal_lands)
    run_dir = copy_of(finished_tiny_run, tmp_path / "run")
    with StopRequest(), pytest.raises(Interrupted) as raised:
        evaluate.main([str(run_dir)])
    assert raised.value.signum == signal.SIGINT
    assert not (run_dir / "eval_best.json").exists()


def test_handing_the_signal_back_says_why_the_launcher_did_not_requeue():
    def requeues(signum, frame):
        raise SystemExit(144)  # submitit's local executor's requeue

    def gives_up(signum, frame):  # submitit, after max_num_timeout requeues
        raise RuntimeError("Job not requeued because: timed-out too many times.")

    previous = signal.signal(signal.SIGUSR2, gives_up)
    try:
        assert hand_back_to_launcher(signal.SIGUSR2) == (
            "Job not requeued because: timed-out too many times."
        )
        signal.signal(signal.SIGUSR2, requeues)
        with pytest.raises(SystemExit):
            hand_back_to_launcher(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        assert "no handler for SIGUSR2" in hand_back_to_launcher(signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)


# A program long enough to lower (~1.5 s) that XLA is still turning it into HLO, on a worker
# thread, when the signal comes. The signal is sent once the main thread is seen waiting inside
# JAX's backend compilation (an event, not a delay a faster machine could miss), three times.
# The script ends with os._exit, as `metalearn.train` does after a stop (a normal exit would
# free what is kept, and XLA's worker may still be using it).
SIGNAL_INSIDE_XLA_CONVERSION = """
import gc, os, signal, sys, threading, time
import jax, jax.numpy as jnp
from metalearn import evaluate
from metalearn.config import to_objects
from metalearn.runner import loop
from metalearn.runner.run import Runner
from metalearn.runner.signals import (
    Interrupted,
    StopRequest,
    hand_back_to_launcher,
    interruption_behind,
)

def program(x):
    for _ in range(3000):
        x = jnp.sin(x) * 1.0001 + jnp.cos(x[::-1])
    return x

def inside_backend_compile():
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_name != "backend_compile_and_load":
        frame = frame.f_back
    return frame is not None

def signal_when_compiling(limit_s=120):
    deadline = time.monotonic() + limit_s  # a safety limit only
    while not inside_backend_compile():
        if time.monotonic() > deadline:
            print("never saw the compilation start", flush=True)
            os._exit(3)
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)

for attempt in range(3):
    lowered = jax.jit(program).lower(jnp.ones(8))
    try:
        with StopRequest() as stop, stop.deferred(), stop.at_once("compilation"):
            threading.Thread(target=signal_when_compiling, daemon=True).start()
            lowered.compile()
        print("compiled before the signal", attempt, flush=True)
    except Interrupted:
        print("interrupted", attempt, flush=True)
    del lowered
    jax.clear_caches()  # nothing but the exception's frames holds the program now
    gc.collect()
    time.sleep(1)
print("alive", flush=True)
os._exit(0)
"""


def test_a_signal_inside_xla_compilation_does_not_crash_the_process_after_it_is_reported():
    # JAX hands a compilation to XLA's worker thread and waits for it in a wait a signal
    # cancels; the worker goes on converting the program inside the MLIR context of the
    # lowering. Letting go of the Interrupted freed that context under it: a segmentation
    # fault in mlir::StringAttr::get on the worker (gdb), after the stop line, in 17 of 60
    # signals sent 1.3-1.7 s into a long run's compilation on 2 cores (none of 60 with the
    # exception kept), and in 6 of 6 runs of this script.
    # XLA's older CPU fusion emitters, which the suite turns on (conftest.py), expand the
    # program's 3000 chained steps, each reading its input twice, exponentially and overflow the
    # compiling thread's stack: this process uses the current ones (XLA's last flag wins).
    env = checkout_env()
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=true"
    proc = finished([sys.executable, "-c", SIGNAL_INSIDE_XLA_CONVERSION], 300, env=env)
    assert proc.stdout.count("interrupted") == 3, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("alive") and proc.returncode == 0, (
        f"exit status {proc.returncode}\n{proc.stdout}{proc.stderr}"
    )
