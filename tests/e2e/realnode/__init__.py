"""A real node for the e2e tests: kubelet + containerd + runc built from their Go modules (see node.py)."""
