"""The helpers tests wait on processes with (tests/cli.py): they return what the process gave,
and a hung or silent process fails the test saying what was waited for, with its output, and
is killed (left running it would hold a core for the rest of the suite)."""

import subprocess
import sys

import pytest

from tests.cli import Watched, communicated, finished

PRINTS_THEN_HANGS = "import time; print('ready', flush=True); time.sleep(600)"


def watched(code: str) -> Watched:
    command = [sys.executable, "-c", code]
    return Watched(
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    )


def test_finished_returns_the_output_and_fails_on_a_hung_command():
    done = finished([sys.executable, "-c", "print('out'); import sys; sys.exit(3)"], 60)
    assert (done.returncode, done.stdout) == (3, "out\n")
    with pytest.raises(pytest.fail.Exception, match=r"waited 0.5 s for .* to exit; last output"):
        finished([sys.executable, "-c", PRINTS_THEN_HANGS], 0.5)


def test_communicated_returns_the_output_and_kills_a_hung_process():
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('out')"], stdout=subprocess.PIPE, text=True
    )
    assert communicated(proc, 60) == ("out\n", None)
    hung = subprocess.Popen(
        [sys.executable, "-c", PRINTS_THEN_HANGS], stdout=subprocess.PIPE, text=True
    )
    with pytest.raises(
        pytest.fail.Exception, match=r"(?s)waited 5 s for .* to exit: killed; last output:\nready"
    ):
        communicated(hung, 5)
    assert hung.poll() is not None  # killed, not left running


def test_watched_finds_a_line_and_reports_what_it_waited_for():
    process = watched(PRINTS_THEN_HANGS)
    assert process.wait_for_line("ready", limit_s=60) == "ready\n"
    with pytest.raises(
        pytest.fail.Exception,
        match=r"waited 0.5 s before a line containing 'never'; still "
        r"running: killed; last output:\nready",
    ):
        process.wait_for_line("never", limit_s=0.5)
    assert process.proc.poll() is not None


def test_watched_says_when_the_process_ended_first():
    process = watched("print('bye')")
    with pytest.raises(
        pytest.fail.Exception,
        match=r"the process ended before a line containing 'ready'; exit status 0",
    ):
        process.wait_for_line("ready", limit_s=60)
    process = watched("print('bye')")
    with pytest.raises(pytest.fail.Exception, match="the process ended before the flag; exit"):
        process.wait_until("the flag", lambda: False, limit_s=60)


def test_watched_exit_returns_everything_or_kills_a_process_that_stays():
    assert watched("print('a'); print('b')").exit(after="printing", limit_s=60) == "a\nb\n"
    process = watched(PRINTS_THEN_HANGS)
    with pytest.raises(
        pytest.fail.Exception, match=r"waited 1 s for the process to exit after SIGINT; still"
    ):
        process.exit(after="SIGINT", limit_s=1)
    assert process.proc.poll() is not None
