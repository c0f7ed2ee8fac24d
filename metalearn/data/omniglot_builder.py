"""Omniglot few-shot classification (Lake et al. 2015) in the Vinyals et al. (2016) split.

TFDS builder ``omniglot_vinyals``: the 1623 characters of the official archives, each a record
of its 20 drawings resized from 105x105 to 28x28 grayscale with Lanczos (antialiased)
filtering, as Finn et al.'s code does; splits ``train`` / ``val`` / ``test`` hold the
1028 / 172 / 423 characters of ``splits/omniglot_vinyals_*.json``. Pixels are stored as in the
source: 255 background, 0 ink.

Sources: ``images_background.zip`` and ``images_evaluation.zip``. Offline, put both in a
directory and pass it as ``data.manual_dir``: they are read from there directly, without
checksum verification (rebuilt copies of the archives have other checksums but the same
images). Online and without a manual directory, TFDS downloads the official archives
(``dl_manager.download``, checked against ``metalearn/data/checksums.tsv``); the zips are read
in place rather than extracted (TFDS's extractor needs TensorFlow). Preparing from the manual
directory takes 7 to 11 s on 2 shared CPU cores (decoding and resizing 32,460 PNGs); the prepared
dataset is 8.6 MB on disk, 26 MB in memory.

The task family ``omniglot`` (:mod:`metalearn.data.omniglot`) imports this module when it is
built.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow_datasets as tfds

from metalearn.data.fewshot_builder import SPLITS, ClassSource, FewShotBuilder
from metalearn.data.sources import (
    DataSourceError,
    ZipSource,
    decode_image,
    download,
    split_json,
)

URL = "https://github.com/brendenlake/omniglot/tree/master/python"
ARCHIVES = {"background": "images_background.zip", "evaluation": "images_evaluation.zip"}
DOWNLOAD_URLS = {
    subset: f"https://github.com/brendenlake/omniglot/raw/master/python/{name}"
    for subset, name in ARCHIVES.items()
}
SIZE = (28, 28)


class OmniglotVinyals(FewShotBuilder):
    """Omniglot characters at 28x28 in the Vinyals split; one record per character."""

    IMAGE_SHAPE = (*SIZE, 1)
    DESCRIPTION = "Omniglot characters (28x28 grayscale, 20 per class) in the Vinyals split."
    HOMEPAGE = "https://github.com/brendenlake/omniglot"
    CITATION = """\
@article{lake2015human, title={Human-level concept learning through probabilistic program
  induction}, author={Lake, Brenden M and Salakhutdinov, Ruslan and Tenenbaum, Joshua B},
  journal={Science}, volume={350}, number={6266}, pages={1332--1338}, year={2015}}"""
    SOURCE_HINT = (
        f"download images_background.zip and images_evaluation.zip from {URL} and put them in "
        "one directory given as data.manual_dir"
    )
    MANUAL_DOWNLOAD_INSTRUCTIONS = SOURCE_HINT

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        archives = self._archives(dl_manager)
        index = {subset: _index_characters(archive) for subset, archive in archives.items()}
        return {
            split: self._generate_examples(self._split_classes(split, archives, index))
            for split in SPLITS
        }

    def _archives(self, dl_manager) -> dict[str, ZipSource]:
        manual_dir = self.manual_dir_or_none(dl_manager)
        if manual_dir is not None:
            paths = {s: os.path.join(manual_dir, name) for s, name in ARCHIVES.items()}
            hint = f"download it from {URL} and put it in {manual_dir}"
        else:
            paths = download(dl_manager, DOWNLOAD_URLS, self.name, self.SOURCE_HINT)
            hint = f"delete it and download again, or {self.SOURCE_HINT}"
        return {s: ZipSource(os.fspath(p), self.name, hint) for s, p in paths.items()}

    def _split_classes(self, split, archives, index) -> list[ClassSource]:
        classes = []
        for subset, alphabets in split_json(f"omniglot_vinyals_{split}.json").items():
            archive = archives[subset]
            for alphabet, characters in alphabets.items():
                for character in characters:
                    members = index[subset].get((alphabet, character))
                    if not members:
                        raise DataSourceError(
                            f"{self.name}: character {alphabet}/{character} of the {split} "
                            f"split is missing from {archive.path}; {archive.how_to_get}"
                        )
                    load = _character_loader(archive, members, self.name)
                    classes.append((f"{alphabet}/{character}", load))
        return classes


def _index_characters(archive: ZipSource) -> dict[tuple[str, str], list[str]]:
    """``{(alphabet, character): sorted PNG member names}`` of an Omniglot archive."""
    index: dict[tuple[str, str], list[str]] = {}
    for name in archive.files():
        parts = name.split("/")
        if len(parts) >= 3 and name.lower().endswith(".png"):
            index.setdefault((parts[-3], parts[-2]), []).append(name)
    return {key: sorted(names) for key, names in index.items()}


def _character_loader(archive: ZipSource, members: list[str], dataset: str):
    def load() -> np.ndarray:
        return np.stack(
            [
                decode_image(
                    archive.read(m),
                    SIZE,
                    "L",
                    where=f"{archive.path}:{m}",
                    dataset=dataset,
                    how_to_get=archive.how_to_get,
                )
                for m in members
            ]
        )

    return load
