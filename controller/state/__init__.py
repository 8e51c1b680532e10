"""What the cluster publishes and what of it is held: inventory from ResourceSlices, the ledger, its audit."""
