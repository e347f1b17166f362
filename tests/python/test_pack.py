"""`opt4torch pack` / image_folder_to_records on the folders people really
have: links that leave the root, empty files, empty class folders, FIFOs and
devices where an image should be. Real files, real links, a real FIFO."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import script

from opt4torch.records import RecordFile, image_folder_to_records


def make_folder(root, classes=("cat", "dog"), per_class=2) -> None:
    for c in classes:
        (root / c).mkdir(parents=True)
        for k in range(per_class):
            (root / c / f"{k}.jpg").write_bytes(f"{c}-{k}".encode() * 10)


def test_a_link_out_of_the_root_is_refused_unless_asked(tmp_path) -> None:
    root = tmp_path / "images"
    make_folder(root)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0")
    (root / "cat" / "evil.jpg").symlink_to(secret)
    with pytest.raises(ValueError, match=r"evil\.jpg leads outside .* symbolic link.*--follow-links"):
        image_folder_to_records(root, tmp_path / "a.rec")
    assert not (tmp_path / "a.rec").exists()
    rf = image_folder_to_records(root, tmp_path / "b.rec", follow_links=True)
    assert b"root:x:0:0" in {rf[i][0] for i in range(len(rf))}


def test_a_link_inside_the_root_is_packed(tmp_path) -> None:
    root = tmp_path / "images"
    make_folder(root)
    (root / "dog" / "again.jpg").symlink_to(root / "cat" / "0.jpg")
    rf = image_folder_to_records(root, tmp_path / "a.rec")
    assert len(rf) == 5


def test_empty_files_are_packed_with_a_warning(tmp_path) -> None:
    root = tmp_path / "images"
    make_folder(root)
    (root / "dog" / "zero.jpg").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"1 empty \(0-byte\) image file.*zero\.jpg"):
        rf = image_folder_to_records(root, tmp_path / "a.rec")
    assert len(rf) == 5 and b"" in {rf[i][0] for i in range(5)}


def test_an_empty_class_folder_is_refused_as_torchvision_does(tmp_path) -> None:
    root = tmp_path / "images"
    make_folder(root)
    (root / "empty").mkdir()
    with pytest.raises(ValueError, match=r"class folder\(s\) 'empty'.*torchvision.*allow-empty"):
        image_folder_to_records(root, tmp_path / "a.rec")
    rf = image_folder_to_records(root, tmp_path / "b.rec", allow_empty=True)
    assert rf.classes == ["cat", "dog", "empty"] and len(rf) == 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "urandom"])
def test_what_is_not_a_regular_file_is_refused_at_once(tmp_path, kind: str) -> None:
    root = tmp_path / "images"
    make_folder(root)
    odd = root / "dog" / "x.jpg"
    if kind == "fifo":
        os.mkfifo(odd)
        expect = "a FIFO"
    else:
        odd.symlink_to("/dev/urandom")
        expect = "a character device"
    with pytest.raises(ValueError, match=rf"x\.jpg is not a regular file \({expect}\)"):
        image_folder_to_records(root, tmp_path / "a.rec", follow_links=True)
    assert not (tmp_path / "a.rec").exists()


def test_the_cli_flags(tmp_path) -> None:
    root = tmp_path / "images"
    make_folder(root)
    (root / "empty").mkdir()
    cmd = [script("opt4torch"), "pack", str(root), str(tmp_path / "a.rec"), "--quiet"]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--allow-empty" in bad.stderr
    ok = subprocess.run(cmd + ["--allow-empty"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "4 records in 3 classes" in ok.stdout
    assert len(RecordFile(tmp_path / "a.rec")) == 4


def _tree_with_a_dot_folder(root) -> None:
    """The issue's tree: five classes and a dot-folder holding an image
    (torchvision makes it class 0, and every other label one higher)."""
    make_folder(root, classes=("ant", "bee", "cat", "dog", "eel"), per_class=7)
    (root / ".ipynb_checkpoints").mkdir()
    (root / ".ipynb_checkpoints" / "x-checkpoint.jpg").write_bytes(b"a checkpoint's image")
    (root / "eel" / ".DS_Store").write_bytes(b"not an image")
    (root / "README.md").write_bytes(b"not a class")


def test_pack_and_image_folder_number_a_dot_folder_alike(tmp_path) -> None:
    import opt4torch

    root = tmp_path / "images"
    _tree_with_a_dot_folder(root)
    ds = opt4torch.ImageFolder(root)
    rf = image_folder_to_records(root, tmp_path / "a.rec")
    assert ds.classes == rf.classes == [".ipynb_checkpoints", "ant", "bee", "cat", "dog", "eel"]
    assert len(ds) == len(rf) == 36
    assert [ds[i] for i in range(len(ds))] == [rf[i] for i in range(len(rf))]  # bytes and labels
    assert rf[0] == (b"a checkpoint's image", 0) and rf[1][1] == 1  # ant is 1, as torchvision numbers it
    # The same through the command line.
    out = subprocess.run([script("opt4torch"), "pack", str(root), str(tmp_path / "b.rec"), "--quiet"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and "36 records in 6 classes" in out.stdout, out.stderr
    assert RecordFile(tmp_path / "b.rec").labels.tolist() == ds.targets

    # The same file filters give the same numbering too.
    def only(path: str) -> bool:
        return path.endswith(("0.jpg", "1.jpg"))

    ds = opt4torch.ImageFolder(root, is_valid_file=only, allow_empty=True)
    rf = image_folder_to_records(root, tmp_path / "c.rec", is_valid_file=only, allow_empty=True)
    assert ds.classes == rf.classes and ds.targets == rf.labels.tolist() == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_a_dot_folder_with_no_image_is_refused_by_both_saying_why(tmp_path) -> None:
    import opt4torch

    root = tmp_path / "images"
    make_folder(root)
    (root / ".cache").mkdir()
    (root / ".cache" / "index.json").write_bytes(b"{}")
    for make in (lambda: opt4torch.ImageFolder(root), lambda: image_folder_to_records(root, tmp_path / "a.rec")):
        with pytest.raises(ValueError, match=r"no valid file for the classes \.cache .* '\.cache' starts with a dot: "
                                             r"torchvision counts such folders as classes too") as e:
            make()
        assert isinstance(e.value, FileNotFoundError)  # what torchvision raises
    assert not (tmp_path / "a.rec").exists()
