"""Prepare and unprepare of claims on this node: locks, NVML steps, MIG mode, device nodes, CDI."""
