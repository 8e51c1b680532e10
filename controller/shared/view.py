"""`flexmig status` for shared (HAMi-core) GPUs: who holds which share, and what is left. Pure.

A shared GPU has no slice map: its bar is the memory, one segment per share in proportion to the MiB it
holds, then the free memory; one line per share (memory, cores, pod, claim, share id), and the free
memory, cores and split slots. Shares are counted exactly as the controller's ledger counts them: a
result without consumedCapacity holds the request-policy defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.shared.capacity import SharedGpuInfo
from controller.state.inventory import DeviceKey
from controller.state.ledger import ShareUse, claim_holdings
from driver.policy.model import GpuRef
from driver.policy.sharemodel import ZERO, ShareAmount

BAR_CELLS = 64  # characters of the memory bar


class _Holder(Protocol):
    @property
    def claim(self) -> str: ...

    @property
    def pods(self) -> tuple[str, ...]: ...

    @property
    def who(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ShareHolding:
    """One share named by a claim's allocation result."""

    holder: _Holder
    share_id: str
    amount: ShareAmount | None  # None: no consumedCapacity, the published defaults apply


def share_holdings(claim: Any, holder: _Holder) -> list[tuple[DeviceKey, ShareHolding]]:
    """The shares a claim's allocation holds, exactly as the ledger reads them."""
    out = []
    for held in claim_holdings(claim):
        if isinstance(held, ShareUse):
            known = held.memory_mib is not None and held.cores is not None and held.shares is not None
            amount = ShareAmount(held.memory_mib or 0, held.cores or 0, held.shares or 0) if known else None
            out.append(((held.pool, held.device), ShareHolding(holder, held.share_id, amount)))
    return out


def shared_gpu_lines(
    ref: GpuRef,
    info: SharedGpuInfo,
    model: str,
    shares: Sequence[ShareHolding],
    paint: Callable[[str, str], str],
    code_of: Callable[[Any], str],
    free_code: str,
) -> list[str]:
    total = info.total()
    title = f"{ref.node}  GPU {ref.gpu_index}  {model}  shared (hami-core)"
    if info.uuid:
        title += f"  {info.uuid}"
    lines = [paint(title, "1")]
    amounts = [s.amount or info.default_amount() for s in shares]
    used = sum(amounts, ZERO)
    parts: list[str] = []
    cells_left = BAR_CELLS
    for share, amount in zip(shares, amounts, strict=True):
        cells = max(3, BAR_CELLS * amount.memory_mib // max(1, total.memory_mib))
        cells = min(cells, cells_left)
        if cells < 3:
            break
        label = f"{amount.memory_mib}Mi {share.holder.who}"
        parts.append(paint("[" + fit_label(label, cells - 2) + "]", code_of(share.holder)))
        cells_left -= cells
    free = total - used
    if cells_left >= 3 and free.memory_mib > 0:
        parts.append(paint("[" + fit_label(f"free {free.memory_mib}Mi", cells_left - 2) + "]", free_code))
    lines.append("  " + "".join(parts))
    for share, amount in sorted(zip(shares, amounts, strict=True), key=lambda sa: -sa[1].memory_mib):
        pod = ("pod " + ",".join(share.holder.pods)) if share.holder.pods else "pod ?"
        cores = f"cores {amount.cores}%" if amount.cores else "cores -"
        default = " (defaults)" if share.amount is None else ""
        text = f"  {amount.memory_mib:>7}Mi  {cores:<10} {pod}  claim {share.holder.claim}{default}"
        lines.append(paint(text, code_of(share.holder)) + f"  [share {share.share_id[:8]}]")
    lines.append(
        f"  free: {max(0, free.memory_mib)}/{total.memory_mib} MiB, cores {max(0, free.cores)}/{total.cores}, "
        f"split slots {max(0, free.shares)}/{total.shares}"
    )
    if free.shares <= 0 or free.memory_mib <= 0:
        lines.append("  still fits: nothing")
    else:
        lines.append(f"  still fits: {free.shares} more share(s), {free.memory_mib} MiB in all")
    if not (
        total.memory_mib >= used.memory_mib and total.cores >= used.cores and total.shares >= used.shares
    ):
        lines.append("  " + paint("warning: shares exceed the GPU's published capacity", "31"))
    return lines


def fit_label(text: str, width: int) -> str:
    """`text` padded or cut (with a trailing ~) to exactly `width` cells of a slice map."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text.ljust(width)
    return text[: width - 1] + "~" if width > 1 else text[:width]
