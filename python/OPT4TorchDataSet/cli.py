"""``opt4``: OPT4TorchDataSet 1.1's command, with its flags and defaults.

    opt4 -d 10000 -t 100000 -o precomputed/plan.safetensors -s 0 -m 3000

writes what ``generate_precomputed_file`` writes (an opt4 plan file, whatever
the extension). ``python -m OPT4TorchDataSet.cli`` runs the same command.
Unlike OPT4TorchDataSet, leaving ``--maxsize`` at 1 warns: the file is then
planned for a cache of one item (the decorators plan again at their own
``maxsize``, so it costs time, not hits).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from opt4torch.cli import UsageError, _check_output


def _count(text: str) -> int:
    """A whole number, also written as 1e11 (as the issue that asked for a
    cost check wrote it): a float that is not whole is refused."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opt4",
        description="Write an OPT precomputed file (the access sequence of a seeded RandomSampler and "
                    "its Belady plan), as OPT4TorchDataSet's opt4 command does.")
    p.add_argument("--dataset-size", "-d", type=_count, required=True,
                   help="dataset size (indices 0 .. dataset_size-1)")
    p.add_argument("--total-iter", "-t", type=_count, required=True, help="total accesses (samples drawn)")
    p.add_argument("--output", "-o", required=True, help="path of the file to write")
    p.add_argument("--seed", "-s", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--maxsize", "-m", type=int, default=None,
                   help="cache capacity in items that the plan is made for (default: 1)")
    p.add_argument("--replacement", action=argparse.BooleanOptionalAction, default=True,
                   help="sample with replacement (default) or without")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from opt4torch.compat.cachelib import generate_precomputed_file

    maxsize = args.maxsize
    if maxsize is None:
        maxsize = 1
        print("opt4: warning: --maxsize was left at 1, so the file is planned for a cache of one item. "
              "Pass -m with the maxsize your cache will have (the decorators plan again at their own "
              "maxsize, which costs time at start-up)", file=sys.stderr)
    try:
        _check_output(args.output)
        started = time.perf_counter()
        plan = generate_precomputed_file(dataset_size=args.dataset_size, total_iterations=args.total_iter,
                                         persist_path=args.output, random_seed=args.seed,
                                         replacement=args.replacement, maxsize=maxsize, progress=False)
    except UsageError as exc:
        parser.exit(2, f"opt4: error: {exc}\n")
    except (OSError, ValueError, TypeError) as exc:
        parser.exit(1, f"opt4: error: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(130, "interrupted\n")
    elapsed = time.perf_counter() - started
    hits = f", {plan.hits} planned hits" if plan.has_decisions else ""
    print(f"wrote {args.output}: {plan.accesses} accesses over {plan.items} items, maxsize={maxsize}"
          f"{hits}, in {elapsed:.2f} s")
    return 0


if __name__ == "__main__":  # python -m OPT4TorchDataSet.cli
    sys.exit(main())
