"""The layout of an image folder as torchvision reads it: its classes
(:func:`find_classes`), its ``(path, label)`` pairs (:func:`make_dataset`),
walked with links followed and loops refused. The one numbering of
:class:`opt4torch.ImageFolder`, ``opt4torch pack`` and ``inspect``
(docs/sources.md, "One numbering").

May touch: nothing; it lists and stats folders.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from .base import IMG_EXTENSIONS

__all__ = ["FolderLoopError", "LayoutError", "find_classes", "make_dataset"]


class LayoutError(FileNotFoundError, ValueError):
    """An image folder laid out so that it has no classes, or a class with
    no file: torchvision raises ``FileNotFoundError`` for these, and the
    packer always raised ``ValueError``; this is both, so that code written
    against either keeps working."""


def find_classes(root: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
    """The classes of an image folder and their numbers, as
    ``torchvision.datasets.folder.find_classes`` gives them: every folder
    directly under ``root`` (and every link to one), sorted by name, numbered
    from 0. Folders whose names start with a dot are classes too
    (``.ipynb_checkpoints``, ``.cache``): torchvision counts them, and a
    number given to one shifts every later label, so skipping them here
    would give other labels than torchvision's for the same tree. This is
    the one rule, for :class:`ImageFolder` and for ``opt4torch pack``
    (docs/sources.md, "One numbering")."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} is not a folder (expected root/<class>/<image files>)")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise LayoutError(f"{root} has no class folders (expected root/<class>/<image files>); torchvision's "
                          "ImageFolder refuses it too (\"Couldn't find any class folder\")")
    return classes, {name: i for i, name in enumerate(classes)}


def make_dataset(root: str | os.PathLike[str], class_to_idx: dict[str, int], *,
                 extensions: str | Sequence[str] | None = None, is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False) -> list[tuple[str, int]]:
    """The ``(path, label)`` pairs of an image folder, in the order
    ``torchvision.datasets.folder.make_dataset`` gives: classes in sorted
    order, each walked by ``os.walk`` with links followed, folders and names
    sorted. A file is kept when ``is_valid_file(path)`` says so, or, without
    one, when its name ends with one of ``extensions`` (default
    :data:`IMG_EXTENSIONS`), case-insensitively; giving both is refused, as
    torchvision refuses it. A class with no file kept is refused unless
    ``allow_empty`` (it then keeps its number and has no sample). A folder
    that is a link back to its own ancestor is refused
    (:class:`FolderLoopError`, naming it), as is one that cannot be listed:
    torchvision walks the first until the paths are too long, and skips the
    second silently."""
    root = os.fspath(root)
    if extensions is not None and is_valid_file is not None:
        raise ValueError("give extensions or is_valid_file, not both (torchvision refuses both too): "
                         "is_valid_file decides alone")
    exts: tuple[str, ...] = ()
    if is_valid_file is None:
        exts = _extensions(IMG_EXTENSIONS if extensions is None else extensions)
        rule = f"no name ends with {', '.join(exts)}"
    elif not callable(is_valid_file):
        raise TypeError(f"is_valid_file must be a callable taking a path, not {type(is_valid_file).__name__}")
    else:
        rule = "is_valid_file accepted none"
    instances: list[tuple[str, int]] = []
    available: set[str] = set()
    for target_class in sorted(class_to_idx):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(root, target_class)
        if not os.path.isdir(target_dir):
            continue
        for dirpath, _, fnames in sorted(_walk_without_loops(target_dir)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if is_valid_file(path) if is_valid_file is not None else path.lower().endswith(exts):
                    instances.append((path, class_index))
                    available.add(target_class)
    empty = sorted(set(class_to_idx) - available)
    if empty and not allow_empty:
        dotted = [c for c in empty if c.startswith(".")]
        hint = ""
        if dotted:
            hint = (f" {', '.join(repr(c) for c in dotted)} {'starts' if len(dotted) == 1 else 'start'} with a dot: "
                    "torchvision counts such folders as classes too, and so does opt4torch (one numbering "
                    "for every reader), so move it out of the root rather than have it shift every label.")
        raise LayoutError(f"Found no valid file for the classes {', '.join(empty)} in {root}: the class "
                          f"folder(s) {', '.join(repr(c) for c in empty)} hold no file that is kept ({rule})."
                          f"{hint} torchvision's ImageFolder refuses such a layout too; remove the folder, or "
                          "pass allow_empty=True (opt4torch pack --allow-empty) to keep it as a class with "
                          "no images")
    return instances


class FolderLoopError(LayoutError):
    """A folder of an image folder that is a link back to one of its own
    ancestors: walked with links followed (as torchvision walks), it would
    repeat the same files under ever longer paths."""


def _walk_without_loops(top: str) -> list[tuple[str, list[str], list[str]]]:
    """``os.walk(top, followlinks=True)`` as a list, refusing a folder that
    is one of its own ancestors (device and inode, so a link loop is found
    the first time it closes, whatever its names), and a folder that cannot
    be listed (os.walk skips those silently, and their images with them)."""
    ident: dict[str, tuple[int, int]] = {}

    def unreadable(exc: OSError) -> None:
        raise PermissionError(exc.errno, f"cannot list the folder {exc.filename} ({exc.strerror}): its images "
                              "would be left out silently (torchvision leaves them out); make it readable, or "
                              "move it out of the image folder") from None

    out = []
    for dirpath, dirnames, fnames in os.walk(top, followlinks=True, onerror=unreadable):
        st = os.stat(dirpath)
        me = (st.st_dev, st.st_ino)
        up = dirpath
        while len(up) > len(top):  # its ancestors inside the walk, top included
            up = os.path.dirname(up)
            if ident.get(up) == me:
                raise FolderLoopError(f"{dirpath} is the folder {up} again (a symbolic link back to its own "
                                      "ancestor): walked with links followed, as torchvision walks, it would "
                                      "repeat the same images under ever longer paths; remove the link")
        ident[dirpath] = me
        out.append((dirpath, dirnames, fnames))
    return out


def _extensions(extensions: str | Sequence[str]) -> tuple[str, ...]:
    """Extensions as a lower-case tuple (a single one may be a str, as
    torchvision allows). torchvision lower-cases only the file name, so an
    upper-case extension there matches nothing; here it matches as meant."""
    exts = (extensions,) if isinstance(extensions, str) else tuple(extensions)
    if not exts or not all(isinstance(e, str) and e for e in exts):
        raise ValueError(f"extensions must be non-empty strings such as '.jpg', not {extensions!r}")
    return tuple(e.lower() for e in exts)
