"""Across ranks and nodes, beside loader/: ranks of a node sharing one pool
(node.py), the set-up of one plan over every node's memory (setup.py) and
the transfers between nodes at run time (exchange.py). Imports pool/, io/
and planning/, never loader/ (the loader hands in how a worker reads).
"""
