"""JAX's persistent compilation cache, on by default: reruns and sweep jobs skip recompiling.
``trainer.compilation_cache`` is ``auto``, an absolute directory, or ``off``. Every program is
stored, not only those compiling for over a second (JAX's default): a small run's dozens of
sub-second programs are most of its start-up."""

from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger("metalearn")

OFF = ("off", "none", "false", "")
# JAX's threshold for storing a program; set in the environment, it is left as given.
MIN_COMPILE_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def cache_directory(setting: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The cache directory for a ``trainer.compilation_cache`` setting, or None when off.

    >>> cache_directory("auto", {"XDG_CACHE_HOME": "/xdg"})
    '/xdg/metalearn/jax'
    >>> cache_directory("auto", {"JAX_COMPILATION_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/xdg"})
    '/c'
    >>> cache_directory("/scratch/jax", {}), cache_directory("off", {}), cache_directory(None, {})
    ('/scratch/jax', None, None)
    """
    environ = os.environ if environ is None else environ
    if setting is None or setting.strip().lower() in OFF:
        return None
    if setting != "auto":
        return os.path.expanduser(setting)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(base, "metalearn", "jax")


def enable_compilation_cache(setting: str | None) -> str | None:
    """Point JAX's persistent cache at the directory of ``setting`` (or turn it off); returns
    it, or None. A named one must be absolute (a typo of ``off`` is no directory) and usable."""
    directory = cache_directory(setting)
    named = directory is not None and setting != "auto"
    if named and not os.path.isabs(directory):
        raise ValueError(
            f"trainer.compilation_cache={setting}: give auto, off, or an absolute directory "
            "(a relative one would be made wherever the command runs)"
        )
    if directory is not None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as err:
            if named:
                raise ValueError(
                    f"trainer.compilation_cache={setting}: cannot use it as a directory "
                    f"({err.strerror}); give another directory, auto or off"
                ) from None
            log.warning("compilation cache off: cannot create %s (%s)", directory, err.strerror)
            directory = None
    jax.config.update("jax_enable_compilation_cache", directory is not None)
    if directory is not None:
        jax.config.update("jax_compilation_cache_dir", directory)
        if MIN_COMPILE_TIME not in os.environ:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory
