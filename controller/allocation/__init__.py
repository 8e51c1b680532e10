"""The allocation job: the loop, one pod's decision, node filters, whole GPUs, deallocation."""
