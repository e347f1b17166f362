"""The torch.utils.data side, one concern a module. "Where does a batch HIT,
where does a MISS load, where does a worker wait?" worker.py. The rest:
dataloader.py (DataLoader: the wiring), checks.py (its arguments), build.py
(capture, plan, pool), sampler.py (batches of positions), iterator.py (what
came out), report.py (log_every), replan.py (epochs cut short),
checkpoint.py (state_dict, load_state_dict), device.py (the stage to the
GPU). Imports pool/, io/, sources/, planning/ and, for ranks and clusters,
distributed/; nothing imports it but the package's front.
"""
