"""Which MIG profile serves a memory request.

The rule: the smallest allowed profile whose NVML memory is at least the
request. NVML memory is below the nominal name (an A100 "1g.5gb" has 4864 MiB), so the comparison uses
`memory_mib`, never the GB figure in the name. Ties on memory go to fewer compute slices, then fewer
memory slices (an A100 1g.10gb before a 2g.10gb: same memory, less compute held), then to the plain
variant before the media variants, whose engines are scarcer and which a plain memory request did not
ask for.

A user may *prefer* a profile (used first if it is allowed and big enough, otherwise ignored, because a
preference written for one GPU model must not make other models unusable) or *pin* one (only that
profile; an error if it is not allowed here or too small).
"""

from __future__ import annotations

from collections.abc import Iterable

from driver.catalog.naming import profile_suffix
from driver.catalog.types import MigProfile

# Plain first; "-me" holds no media engine; "+gfx" needs graphics mode; "+me"/"+me.all" take the
# GPU's media engines, which only requests that need them should consume.
_VARIANT_RANK = {"": 0, "-me": 1, "+gfx": 2, "+me": 3, "+me.all": 4}


class ProfileChoiceError(ValueError):
    """No allowed profile satisfies the request; the message names what is available."""


def size_key(profile: MigProfile) -> tuple[int, int, int, int, str]:
    """Order profiles smallest first: memory, compute slices, memory slices, variant, name."""
    return (
        profile.memory_mib,
        profile.compute_slices,
        profile.memory_slices,
        _VARIANT_RANK.get(profile_suffix(profile.name), len(_VARIANT_RANK)),
        profile.name,
    )


def _describe(profiles: Iterable[MigProfile]) -> str:
    return ", ".join(f"{p.name} ({p.memory_mib} MiB)" for p in sorted(profiles, key=size_key)) or "none"


def candidate_profiles(
    allowed: Iterable[MigProfile],
    memory_mib: int,
    *,
    preferred: str | None = None,
    pinned: str | None = None,
) -> tuple[MigProfile, ...]:
    """Every allowed profile that can serve the request, best first.

    A caller that finds no free placement for the first candidate may fall through to the next one.
    Raises ProfileChoiceError when there is none (naming the largest available or the allowed names).
    """
    if memory_mib < 0:
        raise ProfileChoiceError(f"memory request must not be negative, got {memory_mib} MiB")
    if preferred is not None and pinned is not None and preferred != pinned:
        raise ProfileChoiceError(f"both preferred ({preferred}) and pinned ({pinned}) profile given")
    profiles = sorted(allowed, key=size_key)
    if not profiles:
        raise ProfileChoiceError("no MIG profile is allowed on this GPU")
    if pinned is not None:
        chosen = next((p for p in profiles if p.name == pinned), None)
        if chosen is None:
            names = ", ".join(p.name for p in profiles)
            raise ProfileChoiceError(f"pinned profile {pinned!r} is not allowed here; allowed: {names}")
        if chosen.memory_mib < memory_mib:
            raise ProfileChoiceError(
                f"pinned profile {pinned} has {chosen.memory_mib} MiB, less than the {memory_mib} MiB requested"
            )
        return (chosen,)
    fitting = [p for p in profiles if p.memory_mib >= memory_mib]
    if not fitting:
        largest = profiles[-1]
        raise ProfileChoiceError(
            f"no allowed profile has {memory_mib} MiB; the largest is {largest.name} with "
            f"{largest.memory_mib} MiB (allowed: {_describe(profiles)})"
        )
    if preferred is not None:
        first = next((p for p in fitting if p.name == preferred), None)
        if first is not None:
            fitting.remove(first)
            fitting.insert(0, first)
    return tuple(fitting)


def choose_profile(
    allowed: Iterable[MigProfile],
    memory_mib: int,
    *,
    preferred: str | None = None,
    pinned: str | None = None,
) -> MigProfile:
    """The profile for a request of `memory_mib` MiB (see the module docstring for the rule)."""
    return candidate_profiles(allowed, memory_mib, preferred=preferred, pinned=pinned)[0]
