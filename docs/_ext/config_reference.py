"""The config reference: every setting of the command line, generated from the
config dataclasses when the site builds, so the page cannot drift from the code.

A setting's type and default come from ``dataclasses.fields``; its description from the comment
on its line in the class's source, or from the comment lines just above it. The top-level
sections (``optimizer``, ``trainer``, ``eval``, ``distributed``) come from
:class:`metalearn.config.Config`; the ``algorithm``, ``model`` and ``data`` groups from every
entry registered in :data:`metalearn.registry.GROUPS`, as ``group=NAME`` selects it.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import textwrap
import tokenize
from typing import Any


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the one on its line, else the comment lines right above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(token.start[0])
    found = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for number, line in enumerate(source.splitlines(), start=1):
        name = line.strip().split(":", 1)[0]
        if name not in names or name in found or not line.startswith("    " + name):
            continue
        if number in comments:
            found[name] = comments[number]
            continue
        above, row = [], number - 1
        while row in comments and row not in code_lines:
            above.insert(0, comments[row])
            row -= 1
        found[name] = " ".join(above)
    return found


def default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return "(required)"


def type_name(field: dataclasses.Field) -> str:
    kind = field.type
    return kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


def settings_table(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    """A Markdown table of ``cls``'s fields, each spelled as on the command line."""
    comments = field_comments(cls)
    rows = ["| setting | type | default | what it does |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(cls):
        if field.name in skip or dataclasses.is_dataclass(field.type):
            continue
        value = default_of(field)
        if dataclasses.is_dataclass(value):
            continue
        note = comments.get(field.name, "").replace("|", "\\|")
        rows.append(f"| `{prefix}{field.name}` | `{type_name(field)}` | `{value!r}` | {note} |")
    return rows


def reference_markdown() -> list[str]:
    from metalearn.config import Config
    from metalearn.registry import GROUPS

    lines = ["### Top level", "", *settings_table(Config, "", skip=("algorithm", "model", "data"))]
    for field in dataclasses.fields(Config):
        value = default_of(field)
        if dataclasses.is_dataclass(value):
            cls = type(value)
            lines += ["", f"### `{field.name}`", "", inspect.getdoc(cls) or "", ""]
            lines += settings_table(cls, f"{field.name}.")
    for group, registry in GROUPS.items():
        lines += ["", f"### `{group}=NAME`", ""]
        for name in sorted(registry.names()):
            cls = registry.entry(name).config_cls
            doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            lines += [f"#### `{group}={name}`", "", doc, ""]
            lines += settings_table(cls, f"{group}.", skip=("name",)) + [""]
    return lines


MARKER = "<!-- config-reference -->"


def insert_reference(app: Any, docname: str, source: list[str]) -> None:
    """Replace the marker line of a page with the generated tables, before the page is parsed
    (so their headings are the page's own sections)."""
    if MARKER in source[0]:
        source[0] = source[0].replace(MARKER, "\n".join(reference_markdown()))


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", insert_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
