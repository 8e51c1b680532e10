"""Every HAMi-core shared-GPU rule of the controller: published capacities, shares, their status view."""
