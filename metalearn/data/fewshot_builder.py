"""The TFDS builder shared by the few-shot image datasets, and reading one back as a split layout.

Storage layout (all four datasets): one TFDS record per *class*, ``{"images": uint8 [E, H, W, C],
"class_name": str}``, with splits ``train`` / ``val`` / ``test`` holding disjoint classes. The
features are ``tfds.features.Tensor`` (not ``tfds.features.Image``, which needs TensorFlow) and the
files are ArrayRecord, so preparing and reading need no TensorFlow; reading is random access
through ``builder.as_data_source(split)``. Records keep the order the builder wrote them in
(``disable_shuffling``), so class indices are stable. Classes may hold different numbers of images
``E``; a builder whose source has a known equal size per class (Omniglot's 20 drawings,
miniImageNet's and CIFAR-100's 600) sets ``EQUAL_CLASS_SIZES`` so that a class with another size
is reported as an incomplete source.

:func:`load_split_arrays` prepares a dataset if needed (from a manual directory or by
downloading) and returns each split as a :class:`~metalearn.data.class_split.ClassSplit` (one
image array, per-class offsets and counts), the layout :mod:`metalearn.data.episodes` samples
from.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from metalearn.data.class_split import ClassSplit
from metalearn.data.sources import DataSourceError, directory_setting_problem
from metalearn.errors import one_line

SPLITS = ("train", "val", "test")
log = logging.getLogger("metalearn")


class _SourceFile:
    """``cls.code_path``: the file defining the builder class.

    TFDS's own ``code_path`` needs the ``importlib_resources`` backport for builders in an
    installed package; the answer is the same, so look it up directly.
    """

    def __get__(self, obj, cls) -> epath.Path:
        return epath.Path(inspect.getfile(cls))


# One source class: its name and a function returning its images, uint8 [E, H, W, C].
ClassSource = tuple[str, Callable[[], np.ndarray]]


class FewShotBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base class: one record per class; subclasses set the constants and ``_split_generators``.

    Subclasses return ``{split: self._generate_examples(classes)}`` from ``_split_generators``,
    where ``classes`` lists :data:`ClassSource` pairs; this class checks every class has at
    least one image of shape ``IMAGE_SHAPE`` (and, with ``EQUAL_CLASS_SIZES``, the same number
    of them). Files are ArrayRecord unless the caller asks for another ``file_format``.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release: one record per class, uint8 Tensor features."}
    IMAGE_SHAPE: tuple[int, int, int] = (0, 0, 0)
    EQUAL_CLASS_SIZES = True  # the source has one known size per class; another means damage
    DESCRIPTION = ""
    HOMEPAGE = ""
    CITATION = ""
    # One line: what to download and where to put it (ends every "source missing" error).
    SOURCE_HINT = ""
    code_path = _SourceFile()  # where TFDS finds checksums.tsv: metalearn/data/

    def __init__(self, *, file_format: str | None = None, **kwargs):
        super().__init__(file_format=file_format or "array_record", **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.DESCRIPTION,
            features=tfds.features.FeaturesDict(
                {
                    "images": tfds.features.Tensor(shape=(None, *self.IMAGE_SHAPE), dtype=np.uint8),
                    "class_name": tfds.features.Text(),
                }
            ),
            homepage=self.HOMEPAGE,
            citation=self.CITATION,
            disable_shuffling=True,
        )

    def _generate_examples(self, classes: Iterable[ClassSource]):
        per_class = None
        for class_name, load in classes:
            images = load()
            if images.dtype != np.uint8 or images.shape[1:] != self.IMAGE_SHAPE:
                raise DataSourceError(
                    f"{self.name}: class {class_name} gave images of shape {images.shape} and "
                    f"dtype {images.dtype}; expected [n, {', '.join(map(str, self.IMAGE_SHAPE))}] "
                    "uint8"
                )
            if not len(images):
                raise DataSourceError(
                    f"{self.name}: class {class_name} has no images; the source is incomplete, "
                    "fetch it again"
                )
            if per_class is None:
                per_class = len(images)
            if self.EQUAL_CLASS_SIZES and len(images) != per_class:
                raise DataSourceError(
                    f"{self.name}: class {class_name} has {len(images)} images but the classes "
                    f"before it have {per_class}; the source is incomplete, fetch it again"
                )
            yield class_name, {"images": images, "class_name": class_name}

    # TFDS announces "Downloading and preparing dataset Unknown size (download: Unknown size,
    # ...)" even when nothing is downloaded (sources in a manual directory); say what happens.
    def _log_download_bytes(self) -> None:
        log.info("preparing %s in %s (once: later runs reuse it)", self.name, self.data_dir)

    def _log_download_done(self) -> None:
        log.info("prepared %s in %s", self.name, self.data_dir)

    def manual_dir_or_none(self, dl_manager: tfds.download.DownloadManager) -> str | None:
        """The manual directory if one was given (or TFDS's default one exists), else None."""
        try:
            return os.fspath(dl_manager.manual_dir)
        except (AssertionError, ValueError):
            return None


def concat_classes(records: list[dict], dataset: str, split: str) -> ClassSplit:
    """Per-class records ``{"images": [E_c, H, W, C], "class_name": ...}`` as one split.

    >>> records = [{"images": np.zeros((n, 4, 4, 1), np.uint8), "class_name": b"c"} for n in (3, 5)]
    >>> split = concat_classes(records, "demo", "train")
    >>> split.images.shape, split.counts.tolist(), split.offsets.tolist()
    ((8, 4, 4, 1), [3, 5], [0, 3])
    """
    if not records:
        raise ValueError(f"{dataset}: the {split} split has no classes")
    names = [_text(r.get("class_name", f"class {c}")) for c, r in enumerate(records)]
    try:
        return ClassSplit.from_classes([np.asarray(r["images"], np.uint8) for r in records], names)
    except ValueError as err:
        raise ValueError(f"{dataset}: {split} split: {err}") from err


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def load_split_arrays(
    builder_cls: type[FewShotBuilder],
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    splits: Iterable[str] = SPLITS,
) -> dict[str, ClassSplit]:
    """Prepare ``builder_cls`` if needed and return ``{split: ClassSplit}`` (host arrays).

    ``data_dir`` is the TFDS data directory (None: TFDS's default, ``$TFDS_DATA_DIR`` or
    ``~/tensorflow_datasets``). ``manual_dir`` holds manually downloaded sources; without it a
    builder with official URLs downloads them. A prepared dataset is reused as is.
    """
    for key, value in (("data.manual_dir", manual_dir), ("data.data_dir", data_dir)):
        problem = directory_setting_problem(key, value) if value is not None else None
        if problem:  # data_dir: a NotADirectoryError traceback; manual_dir: "does not exist"
            raise DataSourceError(f"{builder_cls.name}: {problem}; give a directory")
    if manual_dir is not None:
        manual_dir = os.path.expanduser(manual_dir)
        problem = "does not exist" if not os.path.isdir(manual_dir) else "is empty"
        if problem == "does not exist" or not os.listdir(manual_dir):
            raise DataSourceError(
                f"{builder_cls.name}: data.manual_dir={manual_dir} {problem}; "
                f"{builder_cls.SOURCE_HINT}"
            )
    if data_dir is not None:
        data_dir = os.path.expanduser(data_dir)
    try:
        builder = builder_cls(data_dir=data_dir)
    except Exception as err:  # an unreadable dataset_info.json or features.json
        raise _prepared_corrupt(builder_cls.name, data_dir, err) from err
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir)
    )
    arrays = {}
    for split in splits:
        try:
            source = builder.as_data_source(split=split)
            records = [source[i] for i in range(len(source))]
        except Exception as err:  # Riegeli / ArrayRecord corruption, truncated shards
            raise _prepared_corrupt(builder.name, os.fspath(builder.data_dir), err) from err
        arrays[split] = concat_classes(records, builder.name, split)
    return arrays


def _prepared_corrupt(dataset: str, directory: str | None, err: BaseException) -> DataSourceError:
    """The error for a prepared TFDS dataset that cannot be read back: name what to delete.

    >>> print(_prepared_corrupt("demo", "/tfds/demo/1.0.0", RuntimeError("hash mismatch")))
    demo: the prepared dataset in /tfds/demo/1.0.0 is corrupt (RuntimeError: hash mismatch); \
delete that directory, then rerun to prepare it again
    """
    where = directory or f"the TFDS data directory of {dataset}"
    return DataSourceError(
        f"{dataset}: the prepared dataset in {where} is corrupt ({one_line(err)}); delete that "
        "directory, then rerun to prepare it again"
    )
