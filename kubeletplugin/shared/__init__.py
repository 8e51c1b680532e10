"""Every HAMi-core shared-GPU rule of the node: the published shared device, shares, HAMi-core prepare."""
