"""``opt4torch pack``: an image folder (the ImageFolder layout) packed into
a record file, labels beside it.

May touch: the image folder (read), the record file and its sidecar
(written by image_folder_to_records).
"""

from __future__ import annotations

import argparse


def _cmd_pack(args: argparse.Namespace) -> int:
    from ..sources.records import image_folder_to_records

    rf = image_folder_to_records(args.root, args.output, progress=None if not args.quiet else False,
                                 follow_links=args.follow_links, allow_empty=args.allow_empty)
    info = rf.info()
    print(f"{args.output}: {info['count']} records in {len(rf.classes or [])} classes, "
          f"{info['total_bytes'] / 2**20:.1f} MiB of data ({info['file_size'] / 2**20:.1f} MiB file); "
          f"labels and source files in {args.output}.json")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pack", help="pack an image folder (ImageFolder layout) into a record file",
                       description="Pack ROOT/<class>/<image files> into one record file that "
                                   "opt4torch.records.RecordFile reads (with O_DIRECT if asked) and "
                                   "opt4torch.DataLoader prefetches with C threads. Images are kept "
                                   "encoded; labels go to OUTPUT.json.")
    p.add_argument("root", metavar="ROOT", help="the image folder: one subfolder per class")
    p.add_argument("output", metavar="OUTPUT", help="the record file to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--follow-links", action="store_true",
                   help="pack files that symbolic links take outside ROOT (refused by default)")
    p.add_argument("--allow-empty", action="store_true",
                   help="keep class folders with no image as classes (refused by default, as torchvision "
                        "does); anything that is not a regular file is always refused, and empty "
                        "(0-byte) files are packed with a warning")
    p.set_defaults(func=_cmd_pack)
