"""The controller process: its background loops, metrics, health endpoint and fault injection."""
