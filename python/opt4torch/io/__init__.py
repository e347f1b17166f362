"""Threads and files, below everything else: our Python threads parked around
fork (forksafe.py) and writing files safely over opt4_outfile (files.py).
Imports only the binding.
"""
