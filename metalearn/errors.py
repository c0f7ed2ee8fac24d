"""How metalearn words an exception in one line, wherever it reports one."""

from __future__ import annotations


def one_line(err: BaseException) -> str:
    """``"TypeName: message"`` on one line (the whole message), for wrapping a low-level error.

    >>> one_line(ValueError("a\\n  b"))
    'ValueError: a b'
    """
    text = " ".join(str(err).split()) or "no details"
    return f"{type(err).__name__}: {text}"


def headline(err: BaseException) -> str:
    """``"TypeName: first line of the message"``.

    >>> headline(KeyError("missing"))
    "KeyError: 'missing'"
    """
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"
