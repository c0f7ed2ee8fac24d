"""SIGINT/SIGTERM anywhere in a run: stop cleanly, say what was saved, never a traceback. In
the training loop a signal sets a flag (the loop saves a checkpoint and returns), elsewhere it
raises :class:`Interrupted`; a second one ends the process at once. A submitit job's requeue
signal is a stop too, handed back to submitit once the checkpoint is saved. The handler logs
nothing itself (it may land inside a log write): the loop says what came at its next check."""

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


def requeue_signal() -> int | None:
    """The signal on which submitit requeues this process's job, or None outside a submitit job.

    >>> requeue_signal() is None  # not a submitit job
    True
    """
    if "SUBMITIT_FOLDER" not in os.environ:
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


def hand_back_to_launcher(signum: int) -> str | None:
    """Call the launcher's handler for ``signum`` (submitit's requeues the job and raises
    SystemExit); returns why the job was not requeued, or None."""
    handler = signal.getsignal(signum)
    if not callable(handler):
        return f"no handler for {signal.Signals(signum).name} to requeue the job"
    try:
        handler(signum, None)
    except Exception as err:  # submitit's UncompletedJobError: timed out too many times
        return str(err) or type(err).__name__
    return None


class Interrupted(BaseException):
    """A SIGINT or SIGTERM arrived outside the training loop (no ``except Exception`` catches it).

    >>> Interrupted(15).exit_code, Interrupted(2).name
    (143, 'SIGINT')
    """

    def __init__(self, signum: int, phase: str = ""):
        self.signum, self.name, self.exit_code = signum, signal.Signals(signum).name, 128 + signum
        self.phase = phase  # what the run was doing when the signal came
        super().__init__(f"interrupted by {self.name}")


def exit_at_once(code: int) -> None:
    """End the process with ``code`` now, after flushing its output, without Python's exit
    handlers: a normal exit waits for an XLA compilation that a signal interrupted."""
    for stream in [*logging.getLogger().handlers, *log.handlers, sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):
            stream.flush()
    jax = sys.modules.get("jax")
    if jax is not None:  # a multi-host run leaves its coordination service as JAX's exit would
        with contextlib.suppress(Exception):
            jax.distributed.shutdown()
    os._exit(code)


# Every Interrupted raised by a signal, kept with its frames until the process ends: XLA's
# compilation goes on inside the MLIR context those frames hold (freeing it: a segfault).
INTERRUPTED_FRAMES_KEPT: list[Interrupted] = []

REQUEUE_NOTE = " (the cluster's job time limit is near, or the job is pre-empted; it is requeued)"
REDELIVERY_SECONDS = 0.05  # how long a signal that landed in a gc callback waits to come again
_collecting = False  # whether the garbage collector is running
_active: list[StopRequest] = []  # the StopRequests entered and not yet left, innermost last


def interruption_behind(err: BaseException) -> Interrupted | None:
    """The :class:`Interrupted` that ``err`` is, or that a signal raised before it under the
    innermost active :class:`StopRequest`; None if none was.

    A signal's exception lands wherever the main thread is; where that is inside a library
    that catches it and raises its own (JAX's pytree comparison raises a ValueError), the
    interruption surfaces as that error, and is reported as the interruption it is.

    >>> interruption_behind(ValueError("no signal came")) is None
    True
    """
    if isinstance(err, Interrupted):
        return err
    return _active[-1].raised if _active else None


def _track_collection(phase: str, info: dict) -> None:
    global _collecting
    _collecting = phase == "start"


def _swallowing_exceptions(frame) -> bool:
    """Whether ``frame`` runs where Python prints and drops exceptions (gc, ``__del__``)."""
    if _collecting:
        return True
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class StopRequest:
    """Context manager (main thread only): SIGINT/SIGTERM become a flag or :class:`Interrupted`."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.requeue = False  # the launcher's requeue signal came (first or later)
        self._requeue_signal = requeue_signal()
        self.phase = "start-up"
        self._deferring = False
        self.raised: Interrupted | None = None  # what the handler raised
        self._previous: dict[int, object] = {}
        # What a deferred signal has to say, logged by the main thread at the next check
        # (agreed): logged inside the handler, it could land inside a log handler's own write
        # and fail on the stream's reentrant call.
        self._notices: list[str] = []

    def deferred(self, when: bool = True) -> contextlib.AbstractContextManager[StopRequest]:
        """Within this block (when ``when``) a signal only sets ``signum``. Blocks nest."""
        return self._within(self._deferring or when, self.phase)

    def at_once(self, phase: str, when: bool = True) -> contextlib.AbstractContextManager:
        """Within ``deferred()``, a block (compiling the step) where a signal stops it at once."""
        return self._within(False, phase) if when else self._within(self._deferring, self.phase)

    @contextlib.contextmanager
    def _within(self, deferring: bool, phase: str) -> Iterator[StopRequest]:
        saved = self._deferring, self.phase
        self._deferring, self.phase = deferring, phase
        try:
            yield self
        finally:
            self._deferring, self.phase = saved

    def _handle(self, signum, frame) -> None:
        name, requeue = signal.Signals(signum).name, signum == self._requeue_signal
        note = REQUEUE_NOTE if requeue else ""
        self.requeue = self.requeue or requeue
        # SLURM sends the requeue signal and SIGTERM (twice) at a pre-emption: they join a stop.
        joins = requeue or (self.requeue and signum == signal.SIGTERM)
        if joins and (self.signum is not None or self.raised is not None):
            if requeue and self.signum is not None:
                self._notices.append(f"received {name} as well{note}")
            return
        if self.raised is not None or (self.signum is not None and signum == signal.SIGINT):
            # Written to the file descriptor: sys.stderr's buffer may be mid-write below us.
            lines = [*self._notices, f"{name} again: exiting at once"]
            os.write(2, "".join(line + "\n" for line in lines).encode())
            os._exit(128 + signum)
        if self._deferring and self.signum is None:
            self.signum = signum
            self._notices.append(
                f"received {name}{note}: stopping after the current step and saving a checkpoint"
            )
            return
        if _swallowing_exceptions(frame):
            # Raised here, Interrupted would be printed and lost: deliver the signal again later.
            threading.Timer(REDELIVERY_SECONDS, signal.raise_signal, (signum,)).start()
            return
        self.signum = signum
        self.raised = Interrupted(signum, self.phase)
        INTERRUPTED_FRAMES_KEPT.append(self.raised)
        raise self.raised

    def agreed(self) -> bool:
        """Whether any process of the run has been asked to stop: every process calls it at the
        same point, so that none stops alone, leaving the others in a collective. Logs what
        the signals that came since the last call have to say."""
        while self._notices:
            log.warning(self._notices.pop(0))
        jax = sys.modules.get("jax")  # not imported here: one process unless JAX was started
        if jax is None or jax.process_count() == 1:
            return self.signum is not None
        from jax.experimental import multihost_utils

        mine = np.array([self.signum or 0, int(self.requeue)], np.int32)
        every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)
        signalled = every[every[:, 0] > 0]
        if len(signalled) and self.signum is None:
            self.signum = int(signalled[0, 0])
            log.warning(
                f"another process of the run received {signal.Signals(self.signum).name}: "
                "stopping after the current step and saving a checkpoint"
            )
        self.requeue = self.requeue or bool(every[:, 1].any())
        return len(signalled) > 0

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            requeue = (self._requeue_signal,) if self._requeue_signal else ()
            for signum in (signal.SIGINT, signal.SIGTERM, *requeue):
                self._previous[signum] = signal.signal(signum, self._handle)
            gc.callbacks.append(_track_collection)
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in _active:
            _active.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if _track_collection in gc.callbacks:
            gc.callbacks.remove(_track_collection)
