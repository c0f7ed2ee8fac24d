"""Where a run's numbers go: metrics.jsonl, TensorBoard events, and the terminal."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import sys
import time
import uuid

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from metalearn.errors import one_line
from metalearn.runner.events import EventFile
from metalearn.runner.rundir import write_atomically

log = logging.getLogger("metalearn")


class MetricsWriter:
    """Appends one JSON object per logged step to ``metrics.jsonl`` and mirrors scalars to TB.
    On resume, later lines are dropped and a redone (step, split) replaces its record."""

    def __init__(self, workdir: str, resume_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        if not enabled:  # not the primary host of a multi-host run
            return
        kept: list[str] = []
        if resume_step > 0 and os.path.exists(self.path):
            with open(self.path) as f:
                lines = f.readlines()
            self._set_aside_unreadable(lines)
            # a readable last line whose newline was never written is kept, on a line of its own
            kept = [line.rstrip("\n") + "\n" for line in lines if _line_key(line)[0] <= resume_step]
        self._keys = {_line_key(line) for line in kept}
        self._tb_dir = os.path.join(workdir, "tensorboard")
        self._file = self._tb = None
        self._rewrite(kept)

    def _set_aside_unreadable(self, lines: list[str]) -> None:
        """Move unreadable lines, but a half-written last one, to ``metrics.jsonl.unreadable``."""
        if lines and not lines[-1].endswith("\n"):  # a kill while writing it: dropped silently
            lines = lines[:-1]
        unreadable = [(n, line) for n, line in enumerate(lines, 1) if _line_key(line)[1] is None]
        if not unreadable:
            return
        aside = self.path + ".unreadable"
        with open(aside, "a") as f:
            f.writelines(line for _, line in unreadable)
        numbers = ", ".join(str(number) for number, _ in unreadable[:10])
        numbers += ", ..." if len(unreadable) > 10 else ""
        log.warning(
            f"{self.path}: {len(unreadable)} unreadable line(s) (line {numbers}) moved to "
            f"{aside}; the rest is kept"
        )

    def _rewrite(self, lines: list[str]) -> None:
        """Write ``lines`` as ``metrics.jsonl`` and into a new event file, replacing the others."""
        if self._file is not None:
            self.close()
        write_atomically(self.path, "".join(lines))
        self._file = open(self.path, "a")  # noqa: SIM115  (closed in close())
        earlier = glob.glob(os.path.join(glob.escape(self._tb_dir), "events.out.tfevents.*"))
        os.makedirs(self._tb_dir, exist_ok=True)
        # A name of its own: event files are named by the second (two would be one).
        suffix = f".{uuid.uuid4().hex[:12]}"
        self._tb = EventFile(os.path.join(self._tb_dir, "events"), suffix)
        for line in lines:
            self._add_scalars(json.loads(line))
        self._tb.flush()
        for path in earlier:
            os.remove(path)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        key = (int(record["step"]), str(record.get("split")))
        if key in self._keys:  # redone after a resume: replace the earlier record
            with open(self.path) as f:
                kept = [line for line in f if _line_key(line) != key]
            self._rewrite(kept)
        self._keys.add(key)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._add_scalars(record)
        self._tb.flush()

    def _add_scalars(self, record: dict) -> None:
        scalars = [(k, v) for k, v in record.items() if isinstance(v, (int, float)) and k != "step"]
        for entry in record.get("eval", []):
            tag = f"{record['split']}/{entry['metric']}/shots{entry['shots']}_steps{entry['steps']}"
            mean = entry["mean"]  # None when every task is non-finite: NaN in TensorBoard
            scalars.append((tag, float("nan") if mean is None else mean))
        for tag, value in scalars:
            self._tb.add_scalar(tag, step=record["step"], value=value)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._tb.close()


def _line_key(line: str) -> tuple[int, str | None]:
    """``(step, split)`` of a metrics.jsonl line; ``(maxsize, None)`` for an unreadable one."""
    try:
        record = json.loads(line)
        return int(record["step"]), str(record.get("split"))
    except (ValueError, KeyError, TypeError):
        return sys.maxsize, None


def timed_rate(steps: int, seconds: float) -> float | None:
    """Steps per second over timed training, or ``None`` when no step was timed.

    >>> timed_rate(50, 2.0)
    25.0
    >>> timed_rate(0, 0.0) is None
    True
    """
    return steps / max(seconds, 1e-9) if steps > 0 else None


class Progress:
    """A progress bar with steps/s and loss on a terminal; plain log lines otherwise."""

    def __init__(self, total: int, initial: int, mode: str):
        self.total = total
        self._last_step, self._last_time = initial, time.perf_counter()
        self._last_untimed, self._last_untimed_steps = 0.0, 0
        self._bar = None
        # Drops records marked ``file_only`` (per-step lines while the bar shows them).
        self._file_only = lambda record: not getattr(record, "file_only", False)
        if mode == "bar" or (mode == "auto" and sys.stderr.isatty()):
            self._redirect = logging_redirect_tqdm(loggers=[logging.root])
            self._redirect.__enter__()
            self._console = [
                h for h in logging.root.handlers if not isinstance(h, logging.FileHandler)
            ]
            for handler in self._console:
                handler.addFilter(self._file_only)
            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def advance(self, step: int) -> None:
        """Move the bar to ``step`` (cheap: no device synchronisation)."""
        if self._bar is not None:
            self._bar.update(step - self._bar.n)

    def update(
        self,
        step: int,
        metrics: dict[str, float],
        untimed_seconds: float = 0.0,
        untimed_steps: int = 0,
    ) -> float | None:
        """Report metrics at ``step``; returns steps/s since the previous report (None if none
        was timed), leaving out what the ``untimed`` totals (compiling, validating) grew by."""
        now = time.perf_counter()
        rate = timed_rate(
            step - self._last_step - (untimed_steps - self._last_untimed_steps),
            now - self._last_time - (untimed_seconds - self._last_untimed),
        )
        self._last_step, self._last_time = step, now
        self._last_untimed, self._last_untimed_steps = untimed_seconds, untimed_steps
        summary = " ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        if self._bar is not None:
            self._bar.set_postfix_str(summary, refresh=False)
            self.advance(step)
        speed = "compiled" if rate is None else f"{rate:.1f} steps/s"
        log.info(
            f"step {step}/{self.total} | {summary} | {speed}",
            extra={"file_only": self._bar is not None},
        )
        return rate

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            for handler in self._console:
                handler.removeFilter(self._file_only)
            self._redirect.__exit__(None, None, None)


class EvaluationProgress:
    """A bar per shot count on a terminal, one line per shot count otherwise (on stderr)."""

    def __init__(self, num_tasks: int):
        self.num_tasks, self._bar, self._shots = num_tasks, None, None
        self._tty, self._start = sys.stderr.isatty(), time.perf_counter()

    def __call__(self, shots: int, done: int) -> None:
        if shots != self._shots:
            self.close()
            self._shots = shots
            if self._tty:
                self._bar = tqdm(total=self.num_tasks, desc=f"test {shots} shots", unit="task")
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif done == self.num_tasks:
            took = time.perf_counter() - self._start
            print(f"test {shots} shots: {done} tasks in {took:.1f} s", file=sys.stderr)
        if done == self.num_tasks:
            self._start = time.perf_counter()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# What summary.json says of the process that wrote it (its times and rate are its own).
PROCESS_KEYS = (
    "start_step",
    "step",
    "train_seconds",
    "compile_seconds",
    "timed_seconds",
    "steps_per_s",
    "devices",
    "wall_seconds",
)


def earlier_processes(workdir: str) -> list[dict]:
    """The times of the processes that ran this run before, from the ``summary.json`` about to
    be replaced; an unreadable one is kept as ``summary.json.unreadable``."""
    path = os.path.join(workdir, "summary.json")
    try:
        with open(path, "rb") as f:
            previous = json.loads(f.read())
        problem = None if isinstance(previous, dict) else "not a JSON object"
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        problem = one_line(err)
    if problem is not None:
        with contextlib.suppress(OSError):
            os.replace(path, path + ".unreadable")
            log.warning(
                f"{path} could not be read ({problem}): kept as {path}.unreadable; the new "
                "summary lists none of the earlier processes it held"
            )
        return []
    earlier = previous.get("earlier_processes")
    earlier = earlier if isinstance(earlier, list) else []
    return [*earlier, {key: previous.get(key) for key in PROCESS_KEYS}]
