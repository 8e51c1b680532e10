"""The node agent process: wiring, the one-instance node lock, metrics, device health, fault injection."""
