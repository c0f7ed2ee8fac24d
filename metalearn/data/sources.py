"""Reading the source files of the image datasets, with one-line errors that say what to fetch.

The TFDS builders (:mod:`metalearn.data.omniglot`, :mod:`metalearn.data.miniimagenet`,
:mod:`metalearn.data.cifar`) read their sources through these helpers, so a missing file, a
truncated or corrupt archive and a class missing from the source all end in a
:class:`DataSourceError` whose message names the file, what to download and where to put it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from metalearn.errors import one_line

# What reading a damaged archive or image can raise.
READ_ERRORS = (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError, ValueError)


class DataSourceError(RuntimeError):
    """A dataset source is missing, truncated or corrupt; the message says how to fix it."""


def require_file(path: str, dataset: str, how_to_get: str) -> str:
    """Return ``path`` if it is a file, else raise :class:`DataSourceError`.

    >>> require_file("/no/such/file.zip", "omniglot", "download it from https://example.org")
    Traceback (most recent call last):
    ...
    metalearn.data.sources.DataSourceError: omniglot: /no/such/file.zip not found; download it ...
    """
    if not os.path.isfile(path):
        raise DataSourceError(f"{dataset}: {path} not found; {how_to_get}")
    return path


def require_dir(path: str, dataset: str, how_to_get: str) -> str:
    """Return ``path`` if it is a directory, else raise :class:`DataSourceError`."""
    if not os.path.isdir(path):
        raise DataSourceError(f"{dataset}: manual directory {path} does not exist; {how_to_get}")
    return path


def file_in_the_way(directory: str | os.PathLike) -> Path | None:
    """The file that keeps ``directory`` from being one: itself, or the nearest existing
    ancestor when that is a file; None when it is, or can be made, a directory.

    >>> file_in_the_way("/dev/null/x"), file_in_the_way("/tmp/not/yet")
    (PosixPath('/dev/null'), None)
    """
    path = Path(os.path.expanduser(directory))
    existing = next(p for p in (path, *path.parents) if p.exists())  # "/" always does
    return None if existing.is_dir() else existing


def directory_setting_problem(key: str, value: str) -> str | None:
    """``"KEY=VALUE is a file, not a directory"`` (or ``... : FILE is a file ...`` for a path
    under a file) when ``value`` cannot be a directory; else None (it may not exist yet).

    >>> directory_setting_problem("data.data_dir", "/dev/null/x")
    'data.data_dir=/dev/null/x: /dev/null is a file, not a directory'
    >>> directory_setting_problem("data.data_dir", "/tmp") is None
    True
    """
    existing = file_in_the_way(value)
    if existing is None:
        return None
    where = "" if existing == Path(os.path.expanduser(value)) else f": {existing}"
    return f"{key}={value}{where} is a file, not a directory"


def corrupt(path: str, dataset: str, how_to_get: str, err: BaseException) -> DataSourceError:
    """The error for an unreadable source file (to ``raise ... from err``)."""
    return DataSourceError(
        f"{dataset}: {path} is truncated or corrupt ({one_line(err)}); {how_to_get}"
    )


class ZipSource:
    """Random access to the files inside a zip archive, with corrupt archives reported clearly.

    >>> import io, tempfile, zipfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.zip")
    >>> with zipfile.ZipFile(path, "w") as z:
    ...     z.writestr("top/x.txt", "hello")
    >>> source = ZipSource(path, "demo", "download a.zip again")
    >>> source.files(), source.read("top/x.txt")
    (['top/x.txt'], b'hello')
    """

    def __init__(self, path: str, dataset: str, how_to_get: str):
        self.path, self.dataset, self.how_to_get = path, dataset, how_to_get
        require_file(path, dataset, how_to_get)
        try:
            self._zip = zipfile.ZipFile(path)
            self._names = [info.filename for info in self._zip.infolist() if not info.is_dir()]
        except READ_ERRORS as err:
            raise corrupt(path, dataset, how_to_get, err) from err

    def files(self) -> list[str]:
        return list(self._names)

    def read(self, name: str) -> bytes:
        try:
            return self._zip.read(name)
        except READ_ERRORS as err:
            raise corrupt(self.path, self.dataset, self.how_to_get, err) from err


def download(dl_manager, urls: Any, dataset: str, hint: str) -> Any:
    """``dl_manager.download(urls)``, failing fast and clearly when offline.

    TFDS retries a failed download for minutes; an unresolvable host is reported at once.
    ``hint`` says what to do instead (e.g. how to use a manual directory).
    """
    flat = list(urls.values()) if isinstance(urls, dict) else [urls]
    for host in sorted({urlparse(url).hostname for url in flat}):
        try:
            resolve_host(host)
        except OSError as err:
            raise DataSourceError(
                f"{dataset}: cannot reach {host} ({one_line(err)}); if offline, {hint}"
            ) from err
    try:
        return dl_manager.download(urls)
    except Exception as err:  # any network or checksum failure
        raise DataSourceError(
            f"{dataset}: downloading {' and '.join(flat)} failed ({one_line(err)}); "
            f"if offline, {hint}"
        ) from err


def resolve_host(host: str) -> None:
    """Raise OSError if ``host`` has no address (no network, or no DNS)."""
    socket.getaddrinfo(host, 443)


def extract_tar(path: str, destination: str, dataset: str, how_to_get: str) -> str:
    """Extract a (possibly compressed) tar archive once into ``destination``; return it.

    Extraction uses the ``"data"`` filter (no absolute paths, links out of the tree or device
    files). A ``.complete`` marker makes later calls skip the work.
    """
    marker = os.path.join(destination, ".complete")
    if os.path.exists(marker):
        return destination
    require_file(path, dataset, how_to_get)
    try:
        with tarfile.open(path, "r:*") as tar:
            tar.extractall(destination, filter="data")
    except READ_ERRORS as err:
        raise corrupt(path, dataset, how_to_get, err) from err
    with open(marker, "w") as f:
        f.write(path)
    return destination


def read_tar_members(
    path: str, wanted: Callable[[str], bool], dataset: str, how_to_get: str
) -> dict[str, bytes]:
    """The contents of the members of a (possibly compressed) tar archive selected by ``wanted``.

    One sequential pass, so it is also fast on ``.tar.gz`` files.
    """
    require_file(path, dataset, how_to_get)
    contents = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if member.isfile() and wanted(member.name):
                    contents[member.name] = tar.extractfile(member).read()
    except READ_ERRORS as err:
        raise corrupt(path, dataset, how_to_get, err) from err
    return contents


def decode_image(
    data: bytes, size: tuple[int, int], mode: str, *, where: str, dataset: str, how_to_get: str
) -> np.ndarray:
    """Decode an image file, convert it to ``mode`` ("L" or "RGB") and resize it to ``size``.

    Resizing uses Lanczos filtering (antialiased); an image already at ``size`` is untouched.
    Returns uint8 with a trailing channel axis, e.g. (28, 28, 1) for ``mode="L"``.

    >>> from PIL import Image
    >>> png = io.BytesIO()
    >>> Image.new("L", (105, 105), 255).save(png, format="PNG")
    >>> image = decode_image(png.getvalue(), (28, 28), "L", where="x.png", dataset="demo",
    ...                      how_to_get="fetch x.png")
    >>> image.shape, int(image.min())
    ((28, 28, 1), 255)
    """
    from PIL import Image  # imported by the image datasets' preparation only

    try:
        with Image.open(io.BytesIO(data)) as image:
            image = image.convert(mode)
            if image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.Resampling.LANCZOS)
            array = np.asarray(image, dtype=np.uint8)
    except READ_ERRORS as err:
        raise corrupt(where, dataset, how_to_get, err) from err
    return array.reshape(*size, -1)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays, and refuses anything else (no code runs)."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load_data_pickle(data: bytes, *, where: str, dataset: str, how_to_get: str) -> Any:
    """Unpickle a dataset file (dicts, lists, numpy arrays only), Python 2 pickles included.

    Dictionary keys that are bytes (Python 2 strings) are decoded to ``str``.

    >>> data = pickle.dumps({b"labels": [1, 2], "data": np.zeros(2, np.uint8)})
    >>> sorted(load_data_pickle(data, where="x", dataset="demo", how_to_get="fetch x"))
    ['data', 'labels']
    """
    try:
        value = _NumpyOnlyUnpickler(io.BytesIO(data), encoding="latin1").load()
    except (pickle.UnpicklingError, *READ_ERRORS) as err:
        raise corrupt(where, dataset, how_to_get, err) from err
    if isinstance(value, dict):
        value = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in value.items()}
    return value


def split_file(name: str) -> str:
    """The text of a class-split file shipped with metalearn (``metalearn/data/splits/``)."""
    return resources.files("metalearn.data").joinpath("splits", name).read_text()


def split_json(name: str) -> Any:
    """A JSON class-split file shipped with metalearn, parsed.

    >>> len(split_json("cifarfs_val.json"))
    16
    """
    return json.loads(split_file(name))


def split_lines(name: str) -> list[str]:
    """A one-name-per-line class-split file shipped with metalearn.

    >>> split_lines("miniimagenet_ravi_val.txt")[:2]
    ['n01855672', 'n02091244']
    """
    return [line.strip() for line in split_file(name).splitlines() if line.strip()]


def walk_files(root: str) -> Iterator[str]:
    """Every file under ``root`` (sorted, following no symlinked directories)."""
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            yield os.path.join(directory, name)
