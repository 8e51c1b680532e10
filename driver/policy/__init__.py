"""Allocation policy: which node, GPU, profile and placement serve a pod's device requests.

Pure logic over a snapshot of the cluster (catalogs + occupancies); no I/O. The controller feeds it
from its watch cache and calls it only through driver/policy/placer.py; `flexmig simulate` and the
benchmarks call the policies directly on simulated clusters.
"""
