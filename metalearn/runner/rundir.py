"""One run per directory: a rerun may resume it, never silently mix another config into it. A
rerun's record replaces the directory's only with its first checkpoint, so a rerun refused or
interrupted before then leaves the directory as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import OmegaConf

from metalearn.config import Config, to_objects
from metalearn.errors import one_line
from metalearn.runner.layout import (
    RECORD,
    RunDirectoryError,
    check_layout,
    check_outside_stores,
    check_writable,
    resume_hint,
    saved_steps,
)

log = logging.getLogger("metalearn")

HYDRA_COPY = "hydra"  # under checkpoints/: a copy of the .hydra/ files, read if the others fail
LOCK = ".lock"  # held (flock) by the process that trains in the directory
# Keys that change how a run is shown or kept, never what it computes.
IGNORED = (
    "name",
    "run_name",
    "trainer.resume",
    "trainer.compilation_cache",
    "trainer.progress_bar",
    "trainer.allow_changes",
    "trainer.keep_checkpoints",
    "distributed",
)


class RunDirectory:
    """The directory of one run: ``open()`` it once per process, before anything is written,
    then :meth:`record` the run when due (:attr:`new`: at once; else with the first checkpoint)."""

    def __init__(
        self,
        path: str,
        config: Config,
        files: Mapping[str, str] | None = None,
        sweep_dir: str | None = None,
        primary: bool = True,
    ):
        self.path, self.config, self.sweep_dir, self.primary = path, config, sweep_dir, primary
        if files is None:
            files = {"config.yaml": OmegaConf.to_yaml(OmegaConf.structured(config))}
        self.files = dict(files)
        self.changes: dict[str, tuple[Any, Any]] = {}
        self.new = True  # nothing saved yet: the record is due at once
        self._recorded = False

    @contextlib.contextmanager
    def open(self) -> Iterator[RunDirectory]:
        """Hold and check the directory: RunDirectoryError before anything is written."""
        check_writable(self.path)
        fresh = _outputs(self.path)[0] is None
        if fresh:  # no run to race on: a bad config is refused before the lock file is written
            self.changes = check_rerun(self.config, self.path)
        with run_directory_held(self.path) if self.primary else contextlib.nullcontext():
            self.new = _outputs(self.path)[0] is None
            if not (fresh and self.new):  # a run here, or one saved in the meantime
                self.changes = check_rerun(self.config, self.path)
            if self.changes:
                log.warning(
                    "resuming with changed settings (allowed by trainer.allow_changes): %s",
                    ", ".join(f"{k} {a} -> {b}" for k, (a, b) in self.changes.items()),
                )
            yield self

    def record(self) -> None:
        """Write the run's record (once per process; the primary host only)."""
        if self._recorded or not self.primary:
            return
        self._recorded = True
        for relative, text in self.files.items():
            write_atomically(os.path.join(self.path, relative), text)
            if relative.startswith(".hydra/"):  # a second copy, kept with the checkpoints
                copy = os.path.join(self.path, "checkpoints", HYDRA_COPY, relative[7:])
                write_atomically(copy, text)
        path = os.path.join(self.path, "checkpoints", RECORD)
        history = []
        if os.path.exists(path):
            history = _history(path)
            if self.changes:
                steps = saved_steps(self.path)
                history.append({"from_step": max(steps) if steps else 0, "changed": self.changes})
        flat = flat_config(self.config)
        fingerprint = hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()
        record = {"fingerprint": fingerprint, "config": flat, "changes": history}
        write_atomically(path, json.dumps(record, indent=1))

    def resume_hint(self) -> str:
        return resume_hint(self.path, self.sweep_dir)


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (one temporary file per process)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)


@contextlib.contextmanager
def run_directory_held(workdir: str) -> Iterator[None]:
    """Hold ``workdir/.lock`` while training there, refusing a second process meanwhile (a
    ``flock``: released however the process ends, so a stale lock never blocks a resume)."""
    os.makedirs(workdir, exist_ok=True)
    fd = os.open(os.path.join(workdir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunDirectoryError(
            f"{workdir} is in use: {holder} is training there. Nothing was changed. Wait for it "
            "to finish (then rerun to resume or extend it), or choose another hydra.run.dir"
        ) from None
    except OSError as err:  # no locks on this filesystem
        os.close(fd)
        log.warning(
            f"cannot lock {workdir} ({err.strerror}): nothing stops a second process training "
            "there meanwhile"
        )
        yield
        return
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()} (since {started})".encode())
    try:
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it races with a next taker)


def flat_config(cfg: Config) -> dict[str, Any]:
    """The config as ``{"dotted.key": value}``, JSON values, without the IGNORED keys.

    >>> flat = flat_config(Config(algorithm={}, model={}, data={}))
    >>> flat["trainer.meta_steps"], "trainer.resume" in flat, "run_name" in flat
    (70000, False, False)
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif not _matches(prefix, IGNORED):
            flat[prefix] = value

    walk("", json.loads(json.dumps(dataclasses.asdict(cfg))))
    return flat


def _matches(key: str, patterns) -> bool:
    return any(key == p or key.startswith(p + ".") for p in patterns)


def check_allowed_changes(allowed: list[str], *flats: dict[str, Any]) -> None:
    """RunDirectoryError unless each ``allow_changes`` entry names a key or section of ``flats``."""
    names = set(IGNORED)
    for parts in (key.split(".") for flat in flats for key in flat):
        names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    names = sorted(names)
    for entry in allowed:
        if entry not in names:
            close = difflib.get_close_matches(str(entry), names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise RunDirectoryError(
                f"trainer.allow_changes: {entry!r} is not a setting or section of the config; "
                f"name each as a refusal to resume names them (e.g. [trainer.meta_steps,eval])"
                f"{hint}"
            )


def _outputs(workdir: str) -> tuple[str | None, bool]:
    """What ``workdir`` holds of a run's outputs, in words, and whether it is saved results."""
    steps = saved_steps(workdir)
    if steps:
        return f"checkpoints up to step {max(steps)}", True
    if os.path.exists(os.path.join(workdir, "eval.json")):
        return "a finished evaluation", True
    evaluations = sorted(fnmatch.filter(os.listdir(workdir), "eval_*.json"))
    if evaluations:  # metalearn.evaluate's, of a run whose other files are gone
        return evaluations[0], True
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        return "metrics.jsonl, stopped before its first checkpoint", False
    return None, False


def _read_record(path: str) -> dict[str, Any]:
    """The config record at ``path``; ValueError if it is not one."""
    with open(path) as f:
        record = json.load(f)  # json.JSONDecodeError is a ValueError
    if not (isinstance(record, dict) and isinstance(record.get("config"), dict)):
        raise ValueError("not a config record")
    return record


def _history(path: str) -> list[dict[str, Any]]:
    """The changes a config record lists; none when it is missing or damaged."""
    try:
        changes = _read_record(path).get("changes", [])
    except (OSError, ValueError):
        return []
    readable = isinstance(changes, list) and all(
        isinstance(c, dict) and isinstance(c.get("changed"), dict) for c in changes
    )
    return changes if readable else []


def _stored_config(workdir: str) -> dict[str, Any] | None:
    """The flattened config of the run in ``workdir`` (None when it has none); RunDirectoryError
    when none can be read: a run whose config is unknown must not be resumed."""
    record = os.path.join(workdir, "checkpoints", RECORD)
    problems = []
    if os.path.exists(record):
        try:
            return _read_record(record)["config"]
        except (OSError, ValueError) as err:
            problems.append(f"{record} ({one_line(err)})")
    for directory in (os.path.join(workdir, "checkpoints", HYDRA_COPY), workdir):
        path = os.path.join(directory, "config.yaml")
        if not os.path.exists(path):
            continue
        try:
            return flat_config(to_objects(OmegaConf.load(path)))
        except Exception as err:  # unreadable or not a config: try the next copy
            problems.append(f"{path} ({one_line(err)})")
    if not problems:
        return None
    raise RunDirectoryError(
        f"{workdir} holds a run but its config cannot be read: {'; '.join(problems)}. Nothing "
        "was changed. Restore one of these files from a copy to resume it, or choose a new "
        "hydra.run.dir"
    )


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every key whose value differs (absent counts as None)."""
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def check_rerun(cfg: Config, workdir: str) -> dict[str, tuple[Any, Any]]:
    """Raise RunDirectoryError if ``cfg`` must not run in ``workdir``; return allowed changes."""
    check_outside_stores(workdir)
    check_layout(workdir)
    new = flat_config(cfg)
    held, saved = _outputs(workdir)
    if held is None:
        check_allowed_changes(cfg.trainer.allow_changes, new)
        return {}  # nothing saved yet: a fresh start cannot mix anything
    steps = saved_steps(workdir)
    if not cfg.trainer.resume and saved:
        raise RunDirectoryError(
            f"{workdir} already holds a run ({held}) and trainer.resume=false would mix a new "
            f"run into it: choose a new hydra.run.dir, or drop trainer.resume=false to resume"
        )
    if steps and cfg.trainer.meta_steps < max(steps):
        raise RunDirectoryError(
            f"{workdir} holds checkpoints up to step {max(steps)}, beyond "
            f"trainer.meta_steps={cfg.trainer.meta_steps}: a run cannot be shortened. Nothing "
            f"was changed. Evaluate an earlier point of it from its metrics, or choose a new "
            f"hydra.run.dir"
        )
    stored = _stored_config(workdir)
    if stored is None:
        raise RunDirectoryError(
            f"{workdir} holds run outputs ({held}) but no record of their config (config.yaml, "
            f"checkpoints/{RECORD}): a run here would mix with them. Nothing was changed. "
            "Choose a new hydra.run.dir, or move those files away"
        )
    # Keys allowed before count too: the same command line's allow_changes may name a removed key.
    history = _history(os.path.join(workdir, "checkpoints", RECORD))
    allowed_before = {key: None for entry in history for key in entry["changed"]}
    check_allowed_changes(cfg.trainer.allow_changes, new, stored, allowed_before)
    changed = differences(stored, new)
    refused = {k: v for k, v in changed.items() if not _matches(k, cfg.trainer.allow_changes)}
    other_kind = [(k, refused[k]) for k in ("data.name", "model.name") if k in refused]
    if other_kind:  # other data or model: allowing every other key would not make it resume
        raise RunDirectoryError(
            f"{workdir} holds a run of another experiment ({held}; {_shown(other_kind)}). "
            "Nothing was changed. Choose a new hydra.run.dir"
        )
    if refused:
        more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        raise RunDirectoryError(
            f"{workdir} holds a run ({held}) with a different config: "
            f"{_shown(list(refused.items())[:5])}{more}. Nothing was changed. Rerun with its "
            "settings to resume, choose a new hydra.run.dir, or accept the change with "
            f"'trainer.allow_changes=[{','.join(refused)}]'"
        )
    return changed


def _shown(changes: list[tuple[str, tuple[Any, Any]]]) -> str:
    """``key old -> new, ...`` with JSON values (an absent one shown as such)."""
    show = [(k, *("(absent)" if v is None else json.dumps(v) for v in ab)) for k, ab in changes]
    return ", ".join(f"{k} {a} -> {b}" for k, a, b in show)
