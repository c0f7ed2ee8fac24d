"""CIFAR-FS (Bertinetto et al. 2019) and FC100 (Oreshkin et al. 2018): few-shot CIFAR-100.

Both take all 600 images (500 train + 100 test) of each CIFAR-100 class, 32x32 RGB, one
record per class, and split the 100 classes differently:

- TFDS builder ``cifar_fs``: 64 / 16 / 20 classes, drawn across superclasses
  (``splits/cifarfs_*.json``, ``[superclass, class]`` pairs).
- TFDS builder ``fc100``: by superclass, 12 / 4 / 4 superclasses of 5 classes each, i.e.
  60 / 20 / 20 classes (``splits/fc100_superclasses_*.json``), so test classes are semantically
  far from training ones.

Source: the Python version of CIFAR-100, ``cifar-100-python.tar.gz`` (pickled ``train``,
``test`` and ``meta`` files). TFDS downloads it when online; offline, put the archive (or its
extracted ``cifar-100-python/`` folder, as torchvision leaves it) in a directory given as
``data.manual_dir``. The pickles are read with an unpickler that accepts only containers and
numpy arrays.

The task families ``cifarfs`` and ``fc100`` (:mod:`metalearn.data.cifar`) import this module
when they are built.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow_datasets as tfds

from metalearn.data.fewshot_builder import SPLITS, FewShotBuilder
from metalearn.data.sources import (
    DataSourceError,
    download,
    load_data_pickle,
    read_tar_members,
    split_json,
)
from metalearn.errors import one_line

ARCHIVE = "cifar-100-python.tar.gz"
URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
MEMBERS = ("train", "test", "meta")
SOURCE_HINT = f"download {ARCHIVE} from {URL} and put it in a directory given as data.manual_dir"
CITATION = """\
@techreport{krizhevsky2009learning, title={Learning Multiple Layers of Features from Tiny
  Images}, author={Krizhevsky, Alex}, institution={University of Toronto}, year={2009}}"""


@dataclasses.dataclass(frozen=True)
class Cifar100:
    """CIFAR-100 grouped by class: ``images[c]`` holds fine class ``c``'s 600 images."""

    images: np.ndarray  # uint8 [100, 600, 32, 32, 3]: train images first, then test
    fine_names: list[str]
    coarse_names: list[str]
    coarse_of_fine: list[int]


class Cifar100FewShot(FewShotBuilder, skip_registration=True):
    """Base of the CIFAR-100 few-shot builders; subclasses pick each split's classes."""

    IMAGE_SHAPE = (32, 32, 3)
    HOMEPAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"
    SOURCE_HINT = SOURCE_HINT
    MANUAL_DOWNLOAD_INSTRUCTIONS = SOURCE_HINT

    def split_classes(self, split: str, cifar: Cifar100) -> list[int]:
        raise NotImplementedError

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        cifar = self._read_source(dl_manager)
        generators = {}
        for split in SPLITS:
            classes = [
                (
                    f"{cifar.coarse_names[cifar.coarse_of_fine[c]]}/{cifar.fine_names[c]}",
                    lambda c=c: cifar.images[c],
                )
                for c in self.split_classes(split, cifar)
            ]
            generators[split] = self._generate_examples(classes)
        return generators

    def _read_source(self, dl_manager) -> Cifar100:
        manual_dir = self.manual_dir_or_none(dl_manager)
        if manual_dir is None:
            path = os.fspath(download(dl_manager, URL, self.name, SOURCE_HINT))
            return read_cifar100(path, self.name, f"delete it and download again; {SOURCE_HINT}")
        path = os.path.join(manual_dir, ARCHIVE)
        extracted = os.path.join(manual_dir, "cifar-100-python")
        if not os.path.exists(path) and os.path.isdir(extracted):
            path = extracted
        how_to_get = f"download {ARCHIVE} from {URL} and put it in {manual_dir}"
        return read_cifar100(path, self.name, how_to_get)


def read_cifar100(path: str, dataset: str, how_to_get: str) -> Cifar100:
    """Read ``cifar-100-python.tar.gz`` (or its extracted folder) grouped by fine class."""
    if os.path.isdir(path):
        files = {}
        for member in MEMBERS:
            member_path = os.path.join(path, member)
            if not os.path.isfile(member_path):
                raise DataSourceError(f"{dataset}: {member_path} not found; {how_to_get}")
            with open(member_path, "rb") as f:
                files[member] = f.read()
    else:
        raw = read_tar_members(path, lambda n: os.path.basename(n) in MEMBERS, dataset, how_to_get)
        files = {os.path.basename(name): data for name, data in raw.items()}
        missing = [m for m in MEMBERS if m not in files]
        if missing:
            raise DataSourceError(
                f"{dataset}: {path} lacks cifar-100-python/{missing[0]}; is it the Python "
                f"version of CIFAR-100? {how_to_get}"
            )
    parts = {
        m: load_data_pickle(files[m], where=f"{path}:{m}", dataset=dataset, how_to_get=how_to_get)
        for m in MEMBERS
    }
    try:
        fine_names = [_text(n) for n in parts["meta"]["fine_label_names"]]
        coarse_names = [_text(n) for n in parts["meta"]["coarse_label_names"]]
        images, fine, coarse = [], [], []
        for member in ("train", "test"):
            data = np.asarray(parts[member]["data"], np.uint8)
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            fine.append(np.asarray(parts[member]["fine_labels"]))
            coarse.append(np.asarray(parts[member]["coarse_labels"]))
    except (KeyError, TypeError, ValueError) as err:
        raise DataSourceError(
            f"{dataset}: {path} does not hold CIFAR-100 in the expected layout "
            f"({one_line(err)}); {how_to_get}"
        ) from err
    images, fine, coarse = np.concatenate(images), np.concatenate(fine), np.concatenate(coarse)
    order = np.argsort(fine, kind="stable")  # group by class, train images before test ones
    counts = np.bincount(fine, minlength=len(fine_names))
    if len(set(counts.tolist())) != 1:
        raise DataSourceError(
            f"{dataset}: {path} has {counts.min()} to {counts.max()} images per class, expected "
            f"the same number for all; {how_to_get}"
        )
    coarse_of_fine = [int(coarse[np.argmax(fine == c)]) for c in range(len(fine_names))]
    grouped = images[order].reshape(len(fine_names), int(counts[0]), 32, 32, 3)
    return Cifar100(grouped, fine_names, coarse_names, coarse_of_fine)


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


class CifarFs(Cifar100FewShot):
    """CIFAR-FS: 64 / 16 / 20 CIFAR-100 classes (Bertinetto et al. 2019)."""

    DESCRIPTION = "CIFAR-FS: CIFAR-100 (32x32 RGB, 600 per class) in 64 / 16 / 20 classes."
    CITATION = CITATION

    def split_classes(self, split: str, cifar: Cifar100) -> list[int]:
        ids = []
        for superclass, name in split_json(f"cifarfs_{split}.json"):
            if name not in cifar.fine_names:
                raise DataSourceError(
                    f"{self.name}: class {name} of the {split} split is not in the CIFAR-100 "
                    f"source; {SOURCE_HINT}"
                )
            c = cifar.fine_names.index(name)
            if cifar.coarse_names[cifar.coarse_of_fine[c]] != superclass:
                raise DataSourceError(
                    f"{self.name}: class {name} is not in superclass {superclass} in the "
                    f"CIFAR-100 source; {SOURCE_HINT}"
                )
            ids.append(c)
        return ids


class Fc100(Cifar100FewShot):
    """FC100: CIFAR-100 split by superclass, 12 / 4 / 4 (Oreshkin et al. 2018)."""

    DESCRIPTION = "FC100: CIFAR-100 (32x32 RGB, 600 per class) split by superclass, 60/20/20."
    CITATION = CITATION

    def split_classes(self, split: str, cifar: Cifar100) -> list[int]:
        ids = []
        for superclass in split_json(f"fc100_superclasses_{split}.json"):
            if superclass not in cifar.coarse_names:
                raise DataSourceError(
                    f"{self.name}: superclass {superclass} of the {split} split is not in the "
                    f"CIFAR-100 source; {SOURCE_HINT}"
                )
            s = cifar.coarse_names.index(superclass)
            ids.extend(c for c, parent in enumerate(cifar.coarse_of_fine) if parent == s)
        return ids
