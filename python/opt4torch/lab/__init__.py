"""``opt4torch.lab``: the research side, which a training job never imports.

* :mod:`~opt4torch.lab.sim`: replaying sequences through cache policies (the
  C simulator), sweeps on a thread pool.
* :mod:`~opt4torch.lab.traces`: access sequences on disk and seeded generators.
* :mod:`~opt4torch.lab.reference`: the pure-Python reference backend, the
  oracle the C engine is tested against.
* :mod:`~opt4torch.lab.reference_cluster`: the reference of cluster plans
  (where each generation lives across nodes).
* :mod:`~opt4torch.lab.cluster`: the simulator's cluster mode: N virtual
  nodes under no cache, per-node OPT and cluster OPT (docs/cluster.md).
* :mod:`~opt4torch.lab.theory`: closed forms, bounds and approximations.
* :mod:`~opt4torch.lab.science`: theory beside simulation, the figures of
  docs/why-opt.md (``python -m opt4torch.lab.science``).
* :mod:`~opt4torch.lab.plots`: plots of simulation sweeps.
* :mod:`~opt4torch.lab.launch`: several processes on this machine as a
  torchrun job, the tests' and benchmarks' launcher (stacks on a hang).
* :mod:`~opt4torch.lab.e2e`: a real training loop, the caches users would
  otherwise write side by side (``opt4torch demo`` runs it small,
  ``bench/e2e.py`` in full).

The submodules are imported when asked for, not by ``import opt4torch.lab``.
"""

__all__ = ["cluster", "e2e", "launch", "plots", "reference", "reference_cluster", "science", "sim", "theory", "traces"]
