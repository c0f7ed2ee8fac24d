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
(:func:`hand_back_to_launcher`), and submitit requeues the job, which resumes from it. Before,
submitit's handler requeued and exited from inside the training step, and the requeued job
repeated every step since the last periodic checkpoint.
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
    """The signal on which submitit requeues this process's job, when it is a submitit job
    (SLURM sends it ``signal_delay_s`` before the time limit, and on a pre-emption; submitit's
    local executor likewise); else None. submitit names it in ``SUBMITIT_PREEMPT_SIGNAL``
    (default ``USR2``) and sets ``SUBMITIT_FOLDER`` in every job.

    >>> requeue_signal() is None  # not a submitit job
    True
    """
    if "SUBMITIT_FOLDER" not in os.environ:
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


def hand_back_to_launcher(signum: int) -> str | None:
    """Call the handler that the job's launcher installed for ``signum`` (submitit's: it
    requeues the job and exits by raising SystemExit), once what the signal stopped is saved.
    Returns why the job was not requeued (submitit's message), or None when the handler
    returned without requeuing (a task other than the job's first)."""
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
    """A SIGINT or SIGTERM arrived outside the training loop.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way (logging
    swallows errors raised while it writes) can catch it.

    >>> Interrupted(15).exit_code, Interrupted(2).name
    (143, 'SIGINT')
    """

    def __init__(self, signum: int, phase: str = ""):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.phase = phase  # what the run was doing when the signal came

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_at_once(code: int) -> None:
    """End the process with ``code`` now, after flushing what it printed and logged (and
    shutting down JAX's distributed client, as JAX's own exit handler does), without Python's
    exit handlers: a normal exit waits for an XLA compilation that a signal interrupted (it
    runs on, minutes for a long program). Call it only once everything worth keeping is
    written; it ends the interpreter, not only the call (in a notebook too)."""
    for handler in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    jax = sys.modules.get("jax")
    if jax is not None:  # a multi-host run leaves its coordination service as JAX's exit would
        with contextlib.suppress(Exception):
            jax.distributed.shutdown()
    os._exit(code)


def jax_process_count() -> int:
    """The number of processes of the run (1 unless JAX was imported and initialised as one of
    several: this module does not import JAX itself)."""
    jax = sys.modules.get("jax")
    return 1 if jax is None else jax.process_count()


# Every Interrupted raised by a signal, kept until the process ends, with its traceback and so
# with every frame it interrupted. A signal during a compilation cancels JAX's wait for it, but
# XLA's worker thread goes on converting the program inside the MLIR context of the lowering,
# which those frames hold: letting go of the exception freed the context under the worker (a
# segmentation fault in mlir::StringAttr::get, after the stop line was logged, for 17 of 60
# signals sent 1.3-1.7 s into a long run's compilation on 2 cores; none of 60 with it kept).
# The process ends soon after (exit_at_once, without freeing anything).
INTERRUPTED_FRAMES_KEPT: list[Interrupted] = []

# How long a signal that landed in a garbage-collection callback waits to be delivered again.
REDELIVERY_SECONDS = 0.05


class _Collection:
    """Whether the garbage collector is running (a ``gc.callbacks`` entry): the weakref
    callbacks and finalizers it calls print and drop any exception."""

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
    """Context manager: SIGINT/SIGTERM become a flag (in ``deferred()``) or :class:`Interrupted`.

    ``phase`` names what the run is doing, for the message. Outside the main thread (where
    handlers cannot be installed) it does nothing.
    """

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
        :class:`Interrupted` at once, as outside it: one where stopping loses nothing, such as
        compiling the training step from the state last saved (minutes for a long program,
        which a deferred stop would wait for; JAX lets the signal through the compilation)."""
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
        process); every process must call it at the same point, between two training calls.

        The processes of a distributed run each get their own signal, if any (``kill`` of one,
        or SLURM's signals landing on either side of a call boundary): one stopped to save a
        checkpoint, a collective operation the others never joined, and the run hung until
        killed, its checkpoint unsaved. Now they stop together, the signal of the first
        process that had one taken by all."""
        if jax_process_count() == 1:
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
