"""The plugin's Kubernetes API access other than slices: claim status, Node events, start-up RBAC check."""
