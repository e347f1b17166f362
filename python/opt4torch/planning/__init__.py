"""What is decided before the run, in the main process (the engine's
src/plan): capturing the sampler's order (capture.py), the OPT plan and its
file (plan.py), the plan over several nodes (cluster.py, the plan itself in
clusterplan.py, over timeline.py's timeline), and every size the loader chooses
(sizing.py). Imports only the binding and numpy: never a pool, a dataset's
items or torch (capture imports torch when given a sampler, cluster.py's
job_plan torch.distributed).
"""
