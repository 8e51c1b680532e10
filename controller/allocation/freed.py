"""The ledger as if some claims held nothing, for a fit test (preemption and move planning).

Both searches (controller/allocation/preempt.py, controller/allocation/movefit.py) ask the real
decider whether a pod fits once some pods are gone; the cheapest faithful way is to take their claims
out of the controller's own ledger for the length of the test and put them back exactly as they were
(assumed writes stay assumed), instead of copying the ledger for every test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from controller.state.ledger import Ledger


@contextlib.contextmanager
def claims_freed(ledger: Ledger, uids: set[str]) -> Iterator[None]:
    """The ledger as if these claims held nothing, for the length of the block (then exactly as before)."""
    saved = {
        u: (ledger.claims[u], ledger.assumed.get(u, None), u in ledger.assumed)
        for u in uids
        if u in ledger.claims
    }
    for uid in saved:
        ledger.forget(uid)
    try:
        yield
    finally:
        for uid, (devices, rv, assumed) in saved.items():
            ledger.observe(uid, devices)
            if assumed:
                ledger.assumed[uid] = rv


__all__ = ["claims_freed"]
