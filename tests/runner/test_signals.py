"""StopRequest's signal handler, called directly where a real signal could land."""

from __future__ import annotations

import gc
import signal
import sys
import time

import pytest

from metalearn.runner.signals import Interrupted, StopRequest


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
