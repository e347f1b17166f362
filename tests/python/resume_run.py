"""One process of a save-then-resume chain (test_resume.py runs each in a
process of its own): a loader with ``shuffle=True`` and no ``seed=``, two
fork workers, every sample checked byte-equal to the source.

    resume_run.py save STATE OUT EPOCHS BATCHES
        read epoch 0 whole and BATCHES batches of epoch 1, save the state
        (torch.save) to STATE;
    resume_run.py resume STATE OUT EPOCHS
        load STATE into a new loader planned for EPOCHS epochs, read every
        epoch that remains.

OUT gets a JSON record: the loader's seed, the indices read, the plan's
sequence and the cache's counters."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from datasets_for_tests import Checked, expected_tensor

import opt4torch

N, BATCH, CAPACITY = 120, 8, 40


def read(it, batches: int | None = None) -> list[int]:
    out: list[int] = []
    for n, (x, y) in enumerate(it, 1):
        for row, i in zip(x, y.tolist()):
            assert torch.equal(row, expected_tensor(i)), f"sample {i} differs from the source"
        out.extend(y.tolist())
        if n == batches:
            break
    return out


def main() -> None:
    mode, state_path, out_path, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    loader = opt4torch.DataLoader(Checked(N), batch_size=BATCH, shuffle=True, cache_items=CAPACITY, epochs=epochs,
                                  num_workers=2, multiprocessing_context="fork")
    record: dict = {"seed_built": loader.seed}
    try:
        if mode == "save":
            got = read(loader)
            it = iter(loader)
            got += read(it, int(sys.argv[5]))
            state = loader.state_dict()
            del it
            torch.save(state, state_path)
            record["state"] = state
        else:
            state = torch.load(state_path)
            loader.load_state_dict(state)
            got = []
            for _ in range(state["epoch"], epochs):
                got += read(loader)
            record["resumed_at"] = loader.resumed_at
        st = loader.cache.stats()
        record.update(seed=loader.seed, got=got, seq=np.asarray(loader.cache.plan.seq).tolist(),
                      kinds=np.asarray(loader.cache.plan.kinds).tolist(),
                      stats={k: st[k] for k in ("hits", "misses", "fallbacks", "timeouts")})
    finally:
        loader.cache.close()
    with open(out_path, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
