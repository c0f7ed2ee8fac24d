"""The TFDS builder shared by the few-shot image datasets, and reading one back as dense arrays.

Storage layout (all four datasets): one TFDS record per *class*, ``{"images": uint8 [E, H, W, C],
"class_name": str}``, with splits ``train`` / ``val`` / ``test`` holding disjoint classes and every
class of a split holding the same number ``E`` of images. The features are
``tfds.features.Tensor`` (not ``tfds.features.Image``, which needs TensorFlow) and the files are
ArrayRecord, so preparing and reading need no TensorFlow; reading is random access through
``builder.as_data_source(split)``. Records keep the order the builder wrote them in
(``disable_shuffling``), so class indices are stable.

:func:`load_split_arrays` prepares a dataset if needed (from a manual directory or by
downloading) and returns each split as one dense array ``[num_classes, E, H, W, C]``, the
layout :mod:`metalearn.data.episodes` samples from.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from metalearn.data.sources import DataSourceError, one_line

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
    where ``classes`` lists :data:`ClassSource` pairs; this class checks every class has the
    same number of images of shape ``IMAGE_SHAPE``. Files are ArrayRecord unless the caller
    asks for another ``file_format``.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release: one record per class, uint8 Tensor features."}
    IMAGE_SHAPE: tuple[int, int, int] = (0, 0, 0)
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
            if per_class is None:
                per_class = len(images)
            if len(images) != per_class or per_class == 0:
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


def stack_classes(records: list[dict], dataset: str, split: str) -> np.ndarray:
    """Stack per-class records into one array ``[num_classes, E, H, W, C]``, checking shapes.

    >>> images = np.zeros((3, 4, 4, 1), np.uint8)
    >>> stack_classes([{"images": images}] * 2, "demo", "train").shape
    (2, 3, 4, 4, 1)
    """
    if not records:
        raise ValueError(f"{dataset}: the {split} split has no classes")
    shapes = {tuple(r["images"].shape) for r in records}
    if len(shapes) != 1:
        raise ValueError(
            f"{dataset}: classes of the {split} split differ in shape {sorted(shapes)}; "
            "the episode sampler needs the same number of images in every class"
        )
    return np.stack([np.asarray(r["images"], np.uint8) for r in records])


def load_split_arrays(
    builder_cls: type[FewShotBuilder],
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    splits: Iterable[str] = SPLITS,
) -> dict[str, np.ndarray]:
    """Prepare ``builder_cls`` if needed and return ``{split: uint8 [classes, E, H, W, C]}``.

    ``data_dir`` is the TFDS data directory (None: TFDS's default, ``$TFDS_DATA_DIR`` or
    ``~/tensorflow_datasets``). ``manual_dir`` holds manually downloaded sources; without it a
    builder with official URLs downloads them. A prepared dataset is reused as is.
    """
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
        arrays[split] = stack_classes(records, builder.name, split)
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
