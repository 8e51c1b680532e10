"""Devices two claims hold at once: reported as a Warning Event on each claim and as metrics.

The ledger keeps such a device taken until every holder lets go (controller/state/ledger.py); this
says so to the people who must untangle it. Each (device, holders) is reported once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from controller.kube.writer import Writer
from controller.runtime.metrics import ControllerMetrics
from controller.state.ledger import Held, Ledger

log = structlog.get_logger(__name__)


class DoubleHoldReporter:
    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics
        self.reported: set[tuple[Held, tuple[str, ...]]] = set()

    def report(self, ledger: Ledger, writer: Writer | None, claims: Mapping[str, dict[str, Any]]) -> None:
        """Report what the ledger found since the last call (events only when `writer`: the leader)."""
        self.metrics.devices_held_twice.set(ledger.held_twice)
        found, ledger.double_holds = ledger.double_holds, []
        by_uid = {str(c["metadata"].get("uid")): c for c in claims.values()} if found and writer else {}
        for device, holders in found:
            if (device, holders) in self.reported:
                continue
            self.reported.add((device, holders))
            self.metrics.double_holds.inc()
            if writer is None:
                continue
            names = [
                f"{c['metadata'].get('namespace')}/{c['metadata'].get('name')}"
                for c in _known(by_uid, holders)
            ]
            for claim in _known(by_uid, holders):
                try:
                    writer.event(
                        claim,
                        "ResourceClaim",
                        "Warning",
                        "DeviceHeldTwice",
                        f"device {device[1]} of pool {device[0]} is in the allocations of {', '.join(names)}; "
                        "it stays taken until all of them release it",
                    )
                except Exception as exc:  # a report only; the hold itself is already safe
                    log.warning("double hold event not written", device=device, error=str(exc))
        # Forget reports of holds that ended, so a new one of the same device is reported again.
        self.reported = {r for r in self.reported if len(ledger.holders(r[0])) > 1}


def _known(by_uid: Mapping[str, dict[str, Any]], uids: tuple[str, ...]) -> list[dict[str, Any]]:
    return [by_uid[u] for u in uids if u in by_uid]


__all__ = ["DoubleHoldReporter"]
