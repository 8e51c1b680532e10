"""Kubernetes I/O of the controller: raw REST, every write, the list+watch cache, leader election, start-up checks."""
