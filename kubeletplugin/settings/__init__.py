"""The kubelet plugin's settings: command-line flags, their validation, per-node config."""
