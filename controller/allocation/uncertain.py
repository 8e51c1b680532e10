"""Claim writes whose outcome is unknown, held as possibly applied until a read or the watch settles them.

When an allocation write (or the write that clears one) times out, loses its connection after sending,
or gets a 5xx, the claim may or may not have changed on the server (controller/kube/outcome.py). Until
that is known the ledger keeps what the claim may hold: the devices of the allocation we sent, or of the
allocation we tried to clear. Taking either as failed is how one device ends up in two claims.

An entry settles when the watch or a read shows the claim at a version newer than the one the write
was based on (then that version is the truth, whatever it says), or when a read after the write's
deadline shows the claim still at that version (the write did not apply, and with the server's own
`timeout` parameter passed, it no longer can). The claim's pod is not decided again before then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from controller.kube.store import Store, resource_version
from controller.kube.writer import WRITE_TIMEOUT_S, Writer, is_not_found
from controller.state.ledger import Ledger, claim_holdings

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class UnknownWrite:
    namespace: str
    name: str
    based_on: int | None  # the claim's resourceVersion the write was sent with
    settle_after: float  # monotonic: the write's deadline has passed, a read tells the truth
    what: str  # "allocation" or "deallocation", for logs


class UncertainClaims:
    """Claim uid -> its unknown write; settled by `settle` (each step of the leader)."""

    def __init__(self, clock: Any = time.monotonic, on_add: Callable[[], None] = lambda: None) -> None:
        self.entries: dict[str, UnknownWrite] = {}
        self._clock = clock
        self._on_add = on_add

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, claim: dict[str, Any], what: str, deadline_s: float = WRITE_TIMEOUT_S) -> None:
        meta = claim["metadata"]
        self.entries[str(meta["uid"])] = UnknownWrite(
            str(meta["namespace"]),
            str(meta["name"]),
            resource_version(claim),
            self._clock() + deadline_s,
            what,
        )
        self._on_add()
        log.warning(
            "claim write outcome unknown; its devices stay held until a read or the watch shows it",
            claim=f"{meta['namespace']}/{meta['name']}",
            write=what,
            based_on=resource_version(claim),
        )

    def settle(self, writer: Writer, store: Store, ledger: Ledger) -> list[str]:
        """Settle what the watch already shows, and read what is due; the uids settled."""
        done: list[str] = []
        for uid, entry in list(self.entries.items()):
            cached = store.objects.get(f"{entry.namespace}/{entry.name}")
            cached_rv = resource_version(cached)
            if cached is not None and str(cached["metadata"].get("uid")) != uid:
                cached = None  # the name was reused by a new claim: ours is gone
            if cached is not None and _newer(cached_rv, entry.based_on):
                self._settled(uid, done, "watch")  # the ledger has observed that version already
                continue
            if self._clock() < entry.settle_after:
                continue
            try:
                current = writer.read_claim(entry.namespace, entry.name)
            except Exception as exc:
                if not is_not_found(exc):
                    log.info("unknown claim write not settled yet", claim=entry.name, error=str(exc))
                    continue
                ledger.forget(uid)  # the claim is gone, and with it whatever it held
                self._settled(uid, done, "gone")
                continue
            if str(current["metadata"].get("uid")) != uid:
                ledger.forget(uid)
                self._settled(uid, done, "gone")
                continue
            store.assume(current)
            # Whatever this version holds is the truth now, older or newer than our assumption.
            ledger.assumed.pop(uid, None)
            ledger.observe(uid, claim_holdings(current), resource_version(current))
            self._settled(uid, done, "read")
        return done

    def _settled(self, uid: str, done: list[str], how: str) -> None:
        entry = self.entries.pop(uid)
        done.append(uid)
        log.info("unknown claim write settled", claim=f"{entry.namespace}/{entry.name}", by=how)


def _newer(rv: int | None, than: int | None) -> bool:
    return rv is not None and than is not None and rv > than


__all__ = ["UncertainClaims", "UnknownWrite"]
