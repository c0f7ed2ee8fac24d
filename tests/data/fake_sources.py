"""Small generated copies of the real dataset sources, in the real layouts.

Every image is uniform, with a value that encodes its class and example, so the tests can check
that the builders put each image in the right class and order after decoding and resizing.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import zipfile

import numpy as np
from PIL import Image

from metalearn.data.sources import split_json, split_lines

SPLITS = ("train", "val", "test")


def encode(array: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def omniglot_value(class_pos: int, example: int) -> int:
    """Pixel value of example ``example`` of the ``class_pos``-th class of its split."""
    return (class_pos * 3 + example) % 256


def write_omniglot(directory: str, *, per_class: int = 3, drop: str | None = None) -> dict:
    """``images_background.zip`` and ``images_evaluation.zip`` with every Vinyals character.

    Images are 12x12 grayscale PNGs (the real ones are 105x105 1-bit). ``drop`` names an
    ``alphabet/character`` to leave out. Returns ``{split: [alphabet/character, ...]}``.
    """
    os.makedirs(directory, exist_ok=True)
    zips = {
        subset: zipfile.ZipFile(os.path.join(directory, f"images_{subset}.zip"), "w")
        for subset in ("background", "evaluation")
    }
    order = {}
    for split in SPLITS:
        order[split] = []
        for subset, alphabets in split_json(f"omniglot_vinyals_{split}.json").items():
            for alphabet, characters in alphabets.items():
                for character in characters:
                    name = f"{alphabet}/{character}"
                    pos = len(order[split])
                    order[split].append(name)
                    if name == drop:
                        continue
                    for e in range(per_class):
                        pixels = np.full((12, 12), omniglot_value(pos, e), np.uint8)
                        member = f"images_{subset}/{name}/{pos:04d}_{e + 1:02d}.png"
                        zips[subset].writestr(member, encode(pixels, "PNG"))
    for z in zips.values():
        z.close()
    return order


def mini_value(class_pos: int) -> tuple[int, int, int]:
    """RGB colour of the ``class_pos``-th class of its split (JPEG keeps flat colours)."""
    return (40 + 2 * class_pos, 200 - class_pos, 120)


def mini_images(per_class: int = 3):
    """``{split: [(wnid, [uint8 [10, 14, 3] images])]}`` for every Ravi class."""
    out = {}
    for split in SPLITS:
        out[split] = []
        for pos, wnid in enumerate(split_lines(f"miniimagenet_ravi_{split}.txt")):
            image = np.empty((10, 14, 3), np.uint8)
            image[:] = mini_value(pos)
            out[split].append((wnid, [image] * per_class))
    return out


def write_mini_ravi_zip(directory: str, *, per_class: int = 3) -> None:
    """Ravi & Larochelle's layout: ``images/<wnid><8 digits>.jpg`` and csv files, zipped."""
    os.makedirs(directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(directory, "mini-imagenet.zip"), "w") as z:
        for split, classes in mini_images(per_class).items():
            rows = ["filename,label"]
            for wnid, images in classes:
                for e, image in enumerate(images):
                    name = f"{wnid}{e + 1:08d}.jpg"
                    z.writestr(f"images/{name}", encode(image, "JPEG"))
                    rows.append(f"{name},{wnid}")
            z.writestr(f"{split}.csv", "\n".join(rows) + "\n")


def write_mini_class_folders(directory: str, *, per_class: int = 3, as_tar: bool = False):
    """Finn et al.'s layout: ``<split>/<wnid>/*.jpg``, extracted or as ``.tar.gz``."""
    os.makedirs(directory, exist_ok=True)
    files = {
        f"{split}/{wnid}/{wnid}{e + 1:08d}.jpg": encode(image, "JPEG")
        for split, classes in mini_images(per_class).items()
        for wnid, images in classes
        for e, image in enumerate(images)
    }
    if as_tar:
        with tarfile.open(os.path.join(directory, "miniimagenet.tar.gz"), "w:gz") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(f"miniimagenet/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def write_mini_pickles(directory: str, *, per_class: int = 3) -> None:
    """Ren et al.'s ``mini-imagenet-cache-<split>.pkl`` files (84x84 images already)."""
    os.makedirs(directory, exist_ok=True)
    for split, classes in mini_images(per_class).items():
        data, class_dict = [], {}
        for wnid, images in classes:
            class_dict[wnid] = list(range(len(data), len(data) + len(images)))
            data.extend(np.array(Image.fromarray(i).resize((84, 84))) for i in images)
        with open(os.path.join(directory, f"mini-imagenet-cache-{split}.pkl"), "wb") as f:
            pickle.dump({"image_data": np.stack(data), "class_dict": class_dict}, f)


def cifar_names() -> tuple[list[str], list[str]]:
    """CIFAR-100's fine and coarse class names, alphabetical like the real ``meta`` file."""
    pairs = [pair for split in SPLITS for pair in split_json(f"cifarfs_{split}.json")]
    return sorted(c for _, c in pairs), sorted({s for s, _ in pairs})


def write_cifar(
    directory: str, *, train_per_class: int = 2, test_per_class: int = 1, rename: dict | None = None
) -> None:
    """``cifar-100-python.tar.gz`` with ``train``, ``test`` and ``meta`` pickles.

    Pixel (R, G, B) = (fine label, example index within the class, coarse label); example
    indices follow the file order, train images first. ``rename`` changes fine names in ``meta``.
    """
    os.makedirs(directory, exist_ok=True)
    fine_names, coarse_names = cifar_names()
    coarse_of = {
        c: coarse_names.index(s) for split in SPLITS for s, c in split_json(f"cifarfs_{split}.json")
    }
    rng = np.random.default_rng(0)
    members = {}
    for member, per_class, offset in (
        ("train", train_per_class, 0),
        ("test", test_per_class, train_per_class),
    ):
        fine = rng.permutation(np.repeat(np.arange(100), per_class))  # shuffled, as in the real
        seen = np.zeros(100, int)  # example index = order of appearance within the class
        example = np.empty_like(fine)
        for i, f in enumerate(fine):
            example[i], seen[f] = seen[f] + offset, seen[f] + 1
        coarse = np.array([coarse_of[fine_names[f]] for f in fine])
        planes = np.stack([fine, example, coarse], 1)[:, :, None].repeat(1024, 2)
        members[member] = {
            b"data": planes.reshape(-1, 3072).astype(np.uint8),
            b"fine_labels": fine.tolist(),
            b"coarse_labels": coarse.tolist(),
        }
    names = [(rename or {}).get(n, n) for n in fine_names]
    members["meta"] = {"fine_label_names": names, "coarse_label_names": coarse_names}
    with tarfile.open(os.path.join(directory, "cifar-100-python.tar.gz"), "w:gz") as tar:
        for member, content in members.items():
            data = pickle.dumps(content, protocol=2)
            info = tarfile.TarInfo(f"cifar-100-python/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def truncate(path: str, fraction: float = 0.5) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * fraction)])


def unequal_classes(image_shape=(6, 6, 1)) -> dict[str, list[tuple[str, np.ndarray]]]:
    """``{split: [(class name, uint8 [count, *image_shape])]}`` with classes of 3 to 11 images.

    Pixel value = ``16 * class position in its split + example index`` (below 256).
    """
    sizes = {"train": [5, 11, 3, 8, 6, 9], "val": [4, 7, 3], "test": [10, 3, 6]}
    return {
        split: [
            (
                f"{split}_class{c}",
                np.stack([np.full(image_shape, 16 * c + e, np.uint8) for e in range(n)]),
            )
            for c, n in enumerate(counts)
        ]
        for split, counts in sizes.items()
    }
