"""Which published devices a request's selectors admit, per GPU: the candidate index.

`CandidateIndex` compiles each selector set once (CEL through controller/claims/cel.py; tolerations
ride in the set, controller/claims/fields.py) and caches, until the published devices change, the MIG
devices it admits per GPU (`Candidates`), whether it asks for memory only, the shared (HAMi-core) and
whole-GPU devices it admits. So a thousand pods asking for the same class cost one scan. What a claim
asks for is read in controller/claims/requests.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.claims import fields
from controller.claims.cel import CelCompileError, CelEnvironment, DeviceSelector
from controller.claims.requests import Alternative, RequestError
from controller.state.inventory import Inventory, PublishedDevice
from driver.policy.model import GpuRef


@dataclass(slots=True)
class Candidates:
    """The published MIG devices one selector set admits, per GPU."""

    per_gpu: dict[GpuRef, frozenset[tuple[str, int]]]
    min_memory_mib: int
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Compiled:
    selectors: list[DeviceSelector]
    tolerations: list[Mapping[str, Any]]


class CandidateIndex:
    """Per selector set, the matching published MIG devices of every GPU (cached per inventory)."""

    def __init__(self, inventory: Inventory, cel_env: CelEnvironment) -> None:
        self.inventory = inventory
        self.cel = cel_env
        self._cache: dict[tuple[str, ...], Candidates] = {}
        self._memory_only: dict[tuple[str, ...], bool] = {}
        self._shared: dict[tuple[str, ...], dict[GpuRef, PublishedDevice]] = {}
        self._whole: dict[tuple[str, ...], frozenset[GpuRef]] = {}
        # Per (selectors, share spec): what one share consumes on each GPU (controller/shared/shares.py).
        self.share_amounts_cache: dict[tuple[Any, ...], Any] = {}

    def _compiled(self, selectors: Sequence[str]) -> _Compiled:
        cel, tols = fields.split_tolerations(selectors)
        try:
            return _Compiled([self.cel.compile(s) for s in cel], tols)
        except CelCompileError as exc:
            raise RequestError(str(exc)) from exc

    def _match(self, compiled: _Compiled, dev: PublishedDevice, errors: list[str]) -> bool:
        if dev.raw.get("taints") and fields.untolerated(dev.raw, compiled.tolerations) is not None:
            return False
        for sel in compiled.selectors:
            verdict = sel.evaluate(dev.cel)
            if verdict is True:
                continue
            if isinstance(verdict, str) and len(errors) < 3 and verdict not in errors:
                errors.append(verdict)
            return False
        return True

    def matcher(self, selectors: tuple[str, ...]) -> Callable[[PublishedDevice], bool]:
        """Whether one published device passes a selector set (CEL and taints), for any device kind."""
        compiled, errors = self._compiled(selectors), list[str]()
        return lambda dev: self._match(compiled, dev, errors)

    def may_share(self, alt: Alternative) -> bool:
        """Whether HAMi-core shares may serve `alt`, by the rule of controller/shared/shares.py `classify`:
        capacity asked, or no MIG device but a shared one admitted. An alternative nothing matches yet
        counts as one (the devices it waits for may be shared); only MIG or whole-GPU matches do not."""
        if alt.capacity_requested:
            return True
        if self.candidates(alt.selectors).per_gpu:
            return False
        return bool(self.shared_candidates(alt.selectors)) or not self.whole_candidates(alt.selectors)

    def candidates(self, selectors: tuple[str, ...]) -> Candidates:
        hit = self._cache.get(selectors)
        if hit is not None:
            return hit
        compiled = self._compiled(selectors)
        errors: list[str] = []
        per_gpu: dict[GpuRef, frozenset[tuple[str, int]]] = {}
        interned: dict[frozenset[tuple[str, int]], frozenset[tuple[str, int]]] = {}
        min_memory: int | None = None
        for gpu in self.inventory.gpus.values():
            pool = self.inventory.pools[gpu.pool]
            allowed = set()
            for (profile, start), name in gpu.mig_devices.items():
                if self._match(compiled, pool.devices[name], errors):
                    allowed.add((profile, start))
            if allowed:
                frozen = frozenset(allowed)
                per_gpu[gpu.ref] = interned.setdefault(frozen, frozen)  # identical GPUs share one set
                names = {p for p, _ in allowed}
                for prof in gpu.catalog.profiles:
                    if prof.name in names and (min_memory is None or prof.memory_mib < min_memory):
                        min_memory = prof.memory_mib
        result = Candidates(per_gpu, min_memory or 0, errors)
        self._cache[selectors] = result
        return result

    def memory_only(self, selectors: tuple[str, ...]) -> bool:
        """Whether `selectors` admit, on every GPU, exactly the MIG devices of at least
        `candidates(selectors).min_memory_mib`: they ask for memory and nothing else (no model, no
        GPU, no profile), as a burst plan assumes (controller/allocation/podsize.py). A selector that
        admits more (a profile between the asked memory and that least profile) counts as more."""
        hit = self._memory_only.get(selectors)
        if hit is None:
            found = self.candidates(selectors)
            least = found.min_memory_mib
            hit = least > 0
            for gpu in self.inventory.gpus.values() if hit else ():
                memory = {p.name: p.memory_mib for p in gpu.catalog.profiles}
                enough = frozenset(ps for ps in gpu.mig_devices if memory.get(ps[0], 0) >= least)
                if found.per_gpu.get(gpu.ref, frozenset()) != enough:
                    hit = False
                    break
            self._memory_only[selectors] = hit
        return hit

    def whole_candidates(self, selectors: tuple[str, ...]) -> frozenset[GpuRef]:
        """The GPUs whose whole-GPU device `gpu-<i>` a selector set admits (allocated or not)."""
        hit = self._whole.get(selectors)
        if hit is not None:
            return hit
        compiled = self._compiled(selectors)
        errors: list[str] = []
        out = frozenset(
            gpu.ref
            for gpu in self.inventory.gpus.values()
            if gpu.whole_device is not None
            and self._match(compiled, self.inventory.pools[gpu.pool].devices[gpu.whole_device], errors)
        )
        self._whole[selectors] = out
        return out

    def shared_candidates(self, selectors: tuple[str, ...]) -> dict[GpuRef, PublishedDevice]:
        """The shareable GPUs (their `gpu-<i>-shared` devices) a selector set admits."""
        hit = self._shared.get(selectors)
        if hit is not None:
            return hit
        compiled = self._compiled(selectors)
        errors: list[str] = []
        out: dict[GpuRef, PublishedDevice] = {}
        for ref, info in self.inventory.shared.items():
            dev = self.inventory.device((info.pool, info.device))
            if dev is not None and self._match(compiled, dev, errors):
                out[ref] = dev
        self._shared[selectors] = out
        return out
