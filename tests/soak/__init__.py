"""The soak: random churn and a fault matrix on the real control plane, judged by invariants read from
the API server and the simulated GPUs. Run `python3 -m tests.soak --help`; `test_soak_short.py` is the
CI-sized version."""
