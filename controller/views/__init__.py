"""`flexmig status`: the cluster's GPUs and who holds what, as text or as data."""
