"""SIGINT/SIGTERM: finish the current step, save a checkpoint, exit cleanly."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("metalearn")


class StopRequest:
    """Context manager that turns SIGINT/SIGTERM into a flag checked between steps.

    A second SIGINT while stopping raises ``KeyboardInterrupt`` at once (no checkpoint).
    Outside the main thread (where handlers cannot be installed) it does nothing.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        log.warning(
            "received %s: stopping after the current step and saving a checkpoint",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
