"""The node's record of prepared claims, and the reconciles that keep it equal to the GPUs."""
