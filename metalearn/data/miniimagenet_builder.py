"""miniImageNet few-shot classification (Vinyals et al. 2016) in the Ravi & Larochelle split.

TFDS builder ``mini_imagenet_ravi``: 100 ImageNet classes (64 / 16 / 20 wnids in
``splits/miniimagenet_ravi_*.txt``), 600 images each, resized to 84x84 RGB with Lanczos
(antialiased) filtering when they are not 84x84 already; one record per class.

The images cannot be downloaded by TFDS (ImageNet's licence): put them in a directory given as
``data.manual_dir``, in any of the layouts researchers have (they may be mixed):

1. Ravi & Larochelle's release: ``images/n0153282900000005.jpg`` ... (the wnid is the first 9
   characters of the file name), extracted or as a ``.zip`` / ``.tar`` / ``.tar.gz`` archive
   (e.g. ``mini-imagenet.zip``). The csv files next to them are not needed.
2. Per-class folders, as written by Finn et al.'s ``proc_images.py``: ``train/n01532829/*.jpg``,
   ``val/...``, ``test/...`` (any folder named by a wnid counts), extracted or archived.
3. Ren et al.'s pickles ``mini-imagenet-cache-{train,val,test}.pkl`` (``image_data`` uint8
   [N, 84, 84, 3] and ``class_dict`` {wnid: [indices]}), as used by learn2learn.

The same file name found twice (e.g. both ``images/`` and a per-class copy) counts once. Every
class must end up with the same number of images (600 in the real dataset). Tar archives are
extracted by TFDS's download manager (into ``data_dir/downloads/extracted``); zip archives are
read in place.

The task family ``miniimagenet`` (:mod:`metalearn.data.miniimagenet`) imports this module when
it is built.
"""

from __future__ import annotations

import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow_datasets as tfds

from metalearn.data.fewshot_builder import SPLITS, FewShotBuilder
from metalearn.data.sources import (
    DataSourceError,
    ZipSource,
    corrupt,
    decode_image,
    extract_tar,
    load_data_pickle,
    split_lines,
    walk_files,
)

SIZE = (84, 84)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
TAR_EXTENSIONS = (".tar", ".tar.gz", ".tgz")
WNID = re.compile(r"n\d{8}")
PICKLE = re.compile(r"mini-imagenet-cache-(train|val|test)\.pkl")
SOURCE_URL = "https://github.com/twitter/meta-learning-lstm"


class MiniImagenetRavi(FewShotBuilder):
    """miniImageNet at 84x84 in the Ravi split; one record per class (manual download only)."""

    IMAGE_SHAPE = (*SIZE, 3)
    DESCRIPTION = "miniImageNet (84x84 RGB, 600 images per class) in the Ravi & Larochelle split."
    HOMEPAGE = SOURCE_URL
    CITATION = """\
@inproceedings{ravi2017optimization, title={Optimization as a Model for Few-Shot Learning},
  author={Ravi, Sachin and Larochelle, Hugo}, booktitle={ICLR}, year={2017}}"""
    SOURCE_HINT = (
        "get miniImageNet (Ravi & Larochelle's images/ folder or mini-imagenet.zip, per-class "
        f"folders train/<wnid>/*.jpg, or mini-imagenet-cache-*.pkl; see {SOURCE_URL}) and put "
        "it in a directory given as data.manual_dir"
    )
    MANUAL_DOWNLOAD_INSTRUCTIONS = SOURCE_HINT

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        manual_dir = self.manual_dir_or_none(dl_manager)
        if manual_dir is None:
            raise DataSourceError(
                f"{self.name}: no manual directory (TFDS cannot download miniImageNet); "
                f"{self.SOURCE_HINT}"
            )
        extract_root = os.path.join(os.fspath(self.data_dir_root), "downloads", "extracted")
        index = _ImageIndex(manual_dir, self.name, self.SOURCE_HINT, extract_root)
        wnids = {split: split_lines(f"miniimagenet_ravi_{split}.txt") for split in SPLITS}
        index.check_counts(wnids)
        return {
            split: self._generate_examples([(w, index.loader(w, split)) for w in wnids[split]])
            for split in SPLITS
        }


class _ImageIndex:
    """Where each wnid's images are in a manual directory, over the supported layouts."""

    def __init__(self, root: str, dataset: str, hint: str, extract_root: str):
        self.root, self.dataset, self.hint = root, dataset, hint
        self.files: dict[str, dict[str, tuple]] = {}  # wnid -> {basename: (reader, name)}
        self.pickles: dict[str, str] = {}  # wnid -> pickle path
        self._loaded: tuple[str, dict] | None = None  # the last pickle loaded (they are large)
        for path in walk_files(root):
            lower = path.lower()
            if lower.endswith(IMAGE_EXTENSIONS):
                self._add(path, (_read_file, path))
            elif lower.endswith(".zip"):
                archive = ZipSource(path, dataset, f"fetch it again; {hint}")
                for name in archive.files():
                    if name.lower().endswith(IMAGE_EXTENSIONS):
                        self._add(name, (archive.read, name))
            elif lower.endswith(TAR_EXTENSIONS):
                destination = os.path.join(extract_root, os.path.basename(path))
                extracted = extract_tar(path, destination, dataset, f"fetch it again; {hint}")
                for name in walk_files(extracted):
                    if name.lower().endswith(IMAGE_EXTENSIONS):
                        self._add(name, (_read_file, name))
            elif PICKLE.fullmatch(os.path.basename(path)):
                self._add_pickle(path)

    def _add(self, name: str, reader: tuple) -> None:
        parts = name.replace("\\", "/").split("/")
        base = parts[-1]
        folder = parts[-2] if len(parts) > 1 else ""
        if WNID.fullmatch(folder):
            wnid = folder
        elif WNID.match(base):
            wnid = base[:9]
        else:
            return
        self.files.setdefault(wnid, {}).setdefault(base, reader)

    def _add_pickle(self, path: str) -> None:
        # Only the class names are needed now; the pickle is loaded again when generating.
        for wnid in self._load_pickle(path)["class_dict"]:
            self.pickles.setdefault(wnid, path)

    def _load_pickle(self, path: str) -> dict:
        if self._loaded is not None and self._loaded[0] == path:
            return self._loaded[1]
        with open(path, "rb") as f:
            data = load_data_pickle(
                f.read(),
                where=path,
                dataset=self.dataset,
                how_to_get=f"fetch it again; {self.hint}",
            )
        if not isinstance(data, dict) or not {"image_data", "class_dict"} <= set(data):
            raise DataSourceError(
                f"{self.dataset}: {path} lacks image_data/class_dict; fetch it again; {self.hint}"
            )
        data["class_dict"] = {
            k.decode() if isinstance(k, bytes) else k: v for k, v in data["class_dict"].items()
        }
        self._loaded = (path, data)
        return data

    def count(self, wnid: str) -> int:
        if wnid in self.pickles:
            return len(self._load_pickle(self.pickles[wnid])["class_dict"][wnid])
        return len(self.files.get(wnid, ()))

    def check_counts(self, wnids: dict[str, list[str]]) -> None:
        """Every class present, all with the same number of images, before decoding any."""
        counts = {}
        for split, names in wnids.items():
            for wnid in names:
                counts[wnid] = self.count(wnid)
                if not counts[wnid]:
                    raise DataSourceError(
                        f"{self.dataset}: no images of class {wnid} ({split} split) under "
                        f"{self.root}; {self.hint}"
                    )
        values = sorted(counts.values())
        usual = max(set(values), key=values.count)
        odd = [w for w, c in counts.items() if c != usual]
        if odd:
            raise DataSourceError(
                f"{self.dataset}: class {odd[0]} has {counts[odd[0]]} images where most classes "
                f"have {usual} ({len(odd)} classes differ); the source is incomplete or mixes "
                f"layouts, fetch it again; {self.hint}"
            )

    def loader(self, wnid: str, split: str):
        if wnid in self.pickles:
            path = self.pickles[wnid]

            def load_from_pickle() -> np.ndarray:
                data = self._load_pickle(path)
                images = np.asarray(data["image_data"])[np.asarray(data["class_dict"][wnid])]
                return images.astype(np.uint8)  # the builder checks the shape

            return load_from_pickle
        if wnid not in self.files:
            raise DataSourceError(
                f"{self.dataset}: no images of class {wnid} ({split} split) under {self.root}; "
                f"{self.hint}"
            )
        entries = sorted(self.files[wnid].items())

        def load_from_files() -> np.ndarray:
            def decode(entry):
                base, (read, name) = entry
                try:
                    data = read(name)
                except (OSError, zipfile.BadZipFile) as err:
                    raise corrupt(name, self.dataset, f"fetch it again; {self.hint}", err) from err
                return decode_image(
                    data, SIZE, "RGB", where=name, dataset=self.dataset, how_to_get=self.hint
                )

            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                return np.stack(list(pool.map(decode, entries)))

        return load_from_files


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
