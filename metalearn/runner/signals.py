"""SIGINT/SIGTERM anywhere in a run: stop cleanly, say what was saved, never a traceback.

Inside :meth:`StopRequest.deferred` (the training loop) a signal sets a flag: the loop finishes
its current call, saves a checkpoint and returns; while it compiles the step from the state
last saved (:meth:`StopRequest.at_once`), the signal stops it at once. Anywhere else (start-up,
the final validation and test evaluation) the signal raises :class:`Interrupted` at once; the
caller reports the latest saved checkpoint. A second signal while the first is being handled
ends the process at once with exit status ``128 + signal``.

In a job of submitit's (Hydra's submitit launcher), its requeue signal (:func:`requeue_signal`:
SLURM's warning before the job's time limit, and a pre-emption) is a stop too, remembered in
``StopRequest.requeue``: the caller hands it back to submitit once the checkpoint is saved
(:func:`hand_back_to_launcher`), and submitit requeues the job, which resumes from it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

import numpy as np

log = logging.getLogger("metalearn")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def requeue_signal() -> int | None:
    """The signal on which submitit requeues this process's job (``SUBMITIT_PREEMPT_SIGNAL``,
    default ``USR2``; SLURM sends it before the time limit and on a pre-emption), or None
    outside a submitit job (which has ``SUBMITIT_FOLDER`` set).

    >>> requeue_signal() is None  # not a submitit job
    True
    """
    if "SUBMITIT_FOLDER" not in os.environ:
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


def hand_back_to_launcher(signum: int) -> str | None:
    """Call the launcher's handler for ``signum`` (submitit's requeues the job and raises
    SystemExit) once what the signal stopped is saved. Returns why the job was not requeued,
    or None when the handler returned without requeuing (a task other than the job's first)."""
    handler = signal.getsignal(signum)
    if not callable(handler):
        return f"no handler for {signal.Signals(signum).name} to requeue the job"
    try:
        handler(signum, None)
    except SystemExit:
        raise
    except Exception as err:  # submitit's UncompletedJobError: timed out too many times
        return str(err) or type(err).__name__
    return None


class Interrupted(BaseException):
    """A SIGINT or SIGTERM arrived outside the training loop; a BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` on the way (logging's among them) catches it.

    >>> Interrupted(15).exit_code, Interrupted(2).name
    (143, 'SIGINT')
    """

    def __init__(self, signum: int, phase: str = ""):
        self.signum, self.name, self.exit_code = signum, signal.Signals(signum).name, 128 + signum
        self.phase = phase  # what the run was doing when the signal came
        super().__init__(f"interrupted by {self.name}")


def exit_at_once(code: int) -> None:
    """End the process with ``code`` now, after flushing what it printed and logged, without
    Python's exit handlers: a normal exit waits for an XLA compilation that a signal interrupted
    (minutes for a long program). Call it once everything worth keeping is written; it ends the
    interpreter, in a notebook too."""
    for stream in [*logging.getLogger().handlers, *log.handlers, sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):
            stream.flush()
    jax = sys.modules.get("jax")
    if jax is not None:  # a multi-host run leaves its coordination service as JAX's exit would
        with contextlib.suppress(Exception):
            jax.distributed.shutdown()
    os._exit(code)


# Every Interrupted raised by a signal, kept (with the frames it interrupted) until the process
# ends, soon after (exit_at_once): a signal cancels JAX's wait for a compilation, but XLA's
# worker thread goes on inside the MLIR context those frames hold (freeing it: a segfault).
INTERRUPTED_FRAMES_KEPT: list[Interrupted] = []

# How long a signal that landed in a garbage-collection callback waits to be delivered again.
REDELIVERY_SECONDS = 0.05


class _Collection:
    """Whether the garbage collector is running (a ``gc.callbacks`` entry)."""

    running = False

    @classmethod
    def track(cls, phase: str, info: dict) -> None:
        cls.running = phase == "start"


def _swallowing_exceptions(frame) -> bool:
    """Whether ``frame`` runs inside code whose exceptions Python prints and drops: anything
    the garbage collector runs (its callbacks, JAX's among them; weakref callbacks;
    finalizers) or a ``__del__`` method."""
    if _Collection.running:
        return True
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class StopRequest:
    """Context manager: SIGINT/SIGTERM become a flag (in ``deferred()``) or :class:`Interrupted`
    (``phase`` names what the run is doing). Outside the main thread it does nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.requeue = False  # the launcher's requeue signal came (first or later)
        self._requeue_signal = requeue_signal()
        self.phase = "start-up"
        self._deferring = False
        self._raised = False
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextlib.contextmanager
    def deferred(self, when: bool = True) -> Iterator[StopRequest]:
        """Within this block (when ``when``) a signal only sets ``requested``; the loop checks
        it. Blocks nest: leaving one restores what the enclosing one set."""
        deferring = self._deferring
        self._deferring = self._deferring or when
        try:
            yield self
        finally:
            self._deferring = deferring

    @contextlib.contextmanager
    def at_once(self, phase: str, when: bool = True) -> Iterator[StopRequest]:
        """Within ``deferred()``, a block (when ``when``) where a signal raises
        :class:`Interrupted` at once: one where stopping loses nothing, such as compiling the
        step from the state last saved (minutes that a deferred stop would wait for)."""
        if not when:
            yield self
            return
        deferring, previous_phase = self._deferring, self.phase
        self._deferring, self.phase = False, phase
        try:
            yield self
        finally:
            self._deferring, self.phase = deferring, previous_phase

    def _handle(self, signum, frame) -> None:
        if signum == self._requeue_signal:
            self.requeue = True
        if self._stopping_already(signum):
            return
        if self._raised or (self.signum is not None and signum == signal.SIGINT):
            # Already stopping and asked again: leave now, in one line.
            print(f"{signal.Signals(signum).name} again: exiting at once", file=sys.stderr)
            os._exit(128 + signum)
        if self._deferring and self.signum is None:
            self.signum = signum
            log.warning(
                "received %s%s: stopping after the current step and saving a checkpoint",
                signal.Signals(signum).name,
                self._requeue_note(signum),
            )
            return
        if _swallowing_exceptions(frame):
            # Raised here, Interrupted would be printed as "Exception ignored in ..." with a
            # traceback and lost: deliver the signal again once the callback has returned.
            threading.Timer(REDELIVERY_SECONDS, signal.raise_signal, (signum,)).start()
            return
        self.signum = signum
        self._raised = True
        interrupted = Interrupted(signum, self.phase)
        INTERRUPTED_FRAMES_KEPT.append(interrupted)
        raise interrupted

    def agreed(self) -> bool:
        """Whether any process of the run has been asked to stop (``requested`` on one
        process); every process calls it at the same point, between two training calls. Each
        process gets its own signal, if any, and one stopping alone would leave the others in a
        collective it never joins: they stop together, taking the first signalled one's signal."""
        jax = sys.modules.get("jax")  # not imported here: one process unless JAX was started
        if jax is None or jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        mine = np.array([self.signum or 0, int(self.requeue)], np.int32)
        every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)
        signalled = every[every[:, 0] > 0]
        if len(signalled) and self.signum is None:
            self.signum = int(signalled[0, 0])
            log.warning(
                "another process of the run received %s: stopping after the current step and "
                "saving a checkpoint",
                signal.Signals(self.signum).name,
            )
        self.requeue = self.requeue or bool(every[:, 1].any())
        return len(signalled) > 0

    def _requeue_note(self, signum: int) -> str:
        if signum != self._requeue_signal:
            return ""
        return " (the cluster's job time limit is near, or the job is pre-empted; it is requeued)"

    def _stopping_already(self, signum: int) -> bool:
        """Whether ``signum`` only joins a stop under way: the requeue signal, or SIGTERM
        after it, arrive together at a pre-emption (SLURM sends both; and SIGTERM again when it
        requeues the job). SIGINT, or SIGTERM again without the requeue signal, still ends
        the stop at once."""
        if self.signum is None and not self._raised:
            return False
        cluster_pair = {signal.SIGTERM, self._requeue_signal}
        if not (signum == self._requeue_signal or (self.requeue and signum in cluster_pair)):
            return False
        if signum == self._requeue_signal and self.signum is not None:
            log.warning(
                "received %s as well%s", signal.Signals(signum).name, self._requeue_note(signum)
            )
        return True

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            signals = SIGNALS + ((self._requeue_signal,) if self._requeue_signal else ())
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)
            gc.callbacks.append(_Collection.track)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if _Collection.track in gc.callbacks:
            gc.callbacks.remove(_Collection.track)
