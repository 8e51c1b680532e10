"""What a decision is: the reasons the controller adds, each claim's allocation, the node selector.

Kept apart from controller/allocation/decide.py (which re-exports these names) so the helpers of the
decision (allmode.py, upstream.py) can build one without importing the decider.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controller.state.inventory import PublishedDevice
from controller.state.ledger import Held
from driver.policy.model import ShortReason


class ControllerReason(StrEnum):
    """Reasons the controller adds to the policy's ShortReason."""

    INVALID_REQUEST = "InvalidRequest"  # a claim asks for something we cannot allocate
    NO_MATCHING_DEVICE = "NoMatchingDevice"  # selectors admit no published device of ours
    CONSTRAINT_UNSATISFIED = "ConstraintUnsatisfied"  # matchAttribute/distinctAttribute
    COUNTERS_EXCEEDED = "CountersExceeded"  # safety net: published counters disagree
    WRITE_OUTCOME_UNKNOWN = "WriteOutcomeUnknown"  # a claim write's answer was lost (uncertain.py)


@dataclass(slots=True)
class ClaimAllocation:
    claim: Mapping[str, Any]
    results: list[dict[str, Any]]
    config: list[dict[str, Any]]
    devices: list[PublishedDevice]
    held: list[Held] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return str(self.claim["metadata"]["uid"])

    @property
    def keys(self) -> list[Held]:
        """What the ledger counts for this claim: (pool, device) per MIG/whole device, a ShareUse per share."""
        return list(self.held) if self.held else [(d.pool, d.name) for d in self.devices]


@dataclass(slots=True)
class Decision:
    node: str | None = None
    allocations: list[ClaimAllocation] = field(default_factory=list)
    reason: str | None = None
    message: str = ""
    stranded_mib: int = 0  # memory stranded by the devices of mixed MIG/HAMi-core requests
    isolated: int = 0  # MIG devices chosen for mixed requests (ties go to isolation)

    @property
    def ok(self) -> bool:
        return self.reason is None


def node_selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }


def short_reason_values() -> list[str]:
    return [r.value for r in ShortReason] + [r.value for r in ControllerReason]
