"""A pod's lifetime hint: the `gpu.flexmig.dev/expected-duration` annotation -> an expected end.

The MIG policy (driver/policy/allocator.py `PackingPolicy.colocation`) prefers, for a pod with an
expected end, GPUs whose running pods end no earlier, so that GPUs empty out together and free whole
for large requests. The hint is advisory: a missing annotation means no hint, and a value that cannot
be read (or is not positive) also means no hint, with a warning naming the annotation, the value and
the accepted forms; the pod is placed either way.

Times are wall-clock seconds since the epoch, the clock both a decision (`decision_hint`: the pod
has not started, so it ends a duration from now) and the ledger's view of released pods
(`running_end`: from the pod's start; before it starts, the end known from its decision) use.

`ClaimEnds` keeps those ends per claim and pod, so that the end of a claim's allocation is known
whichever of pod, claim and our own writes the watch shows first, and survives the window between
the gate's removal and the pod's start (status.startTime is set by the kubelet after binding: a pod
that waited in the gate longer than its duration would otherwise get an end in the past).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from api.constants import ANNOTATION_EXPECTED_DURATION
from driver.policy.model import EndHint

ACCEPTED_FORMS = "a Go duration such as 90s, 45m, 2h30m or 1h15m30.5s (units h, m, s, ms), or plain seconds"

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_GO_DURATION = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:ms|h|m|s)")
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_MAX_SECONDS = 10 * 365 * 24 * 3600.0  # ten years: anything longer is a typo, not a plan


class DurationError(ValueError):
    """The annotation's value is not a positive duration; the message names the value and the forms."""


def parse_duration(text: str) -> float:
    """Seconds of `90s`, `45m`, `2h30m`, `1.5h`, `500ms` or `3600` (plain seconds); > 0 and finite."""
    value = text.strip()
    seconds: float
    if re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", value):
        seconds = float(value)
    elif value and re.fullmatch(f"(?:{_GO_DURATION.pattern})+", value):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(value))
    else:
        raise DurationError(
            f"annotation {ANNOTATION_EXPECTED_DURATION}={text!r} is not a duration; accepted: {ACCEPTED_FORMS}"
        )
    if not (math.isfinite(seconds) and 0 < seconds <= _MAX_SECONDS):
        raise DurationError(
            f"annotation {ANNOTATION_EXPECTED_DURATION}={text!r} must be more than 0 and at most ten "
            f"years; accepted: {ACCEPTED_FORMS}"
        )
    return seconds


def _annotation(pod: Mapping[str, Any]) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_EXPECTED_DURATION)
    return None if value is None else str(value)


def pod_duration(pod: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """(seconds, None) for a readable annotation, (None, why) for a bad one, (None, None) without one."""
    text = _annotation(pod)
    if text is None:
        return None, None
    try:
        return parse_duration(text), None
    except DurationError as exc:
        return None, str(exc)


def decision_hint(pod: Mapping[str, Any], now: float) -> tuple[EndHint | None, str | None]:
    """The hint to decide a gated pod with (it starts once allocated: it ends `duration` after `now`),
    and the problem with its annotation, if any."""
    seconds, problem = pod_duration(pod)
    if seconds is None:
        return None, problem
    return EndHint(now + seconds, seconds), None


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def running_end(pod: Mapping[str, Any], now: float, known: float | None = None) -> float | None:
    """When a pod that holds devices (or is about to) is expected to end; None without a good hint.

    Started (status.startTime): its start plus its annotated duration. Not started yet: `known`, the
    end already recorded for it (its decision, or an earlier event), else a duration from `now` (it
    cannot end earlier). Not from metadata.creationTimestamp: a pod that waited in the gate longer
    than its duration would get an end in the past."""
    seconds, _ = pod_duration(pod)
    if seconds is None:
        return None
    began = _timestamp((pod.get("status") or {}).get("startTime"))
    if began is not None:
        return began + seconds
    return known if known is not None else now + seconds


class ClaimEnds:
    """The expected end of every hinted pod, by the claims it references (claim key -> pod uid ->
    end). A claim's end is the latest of its pods' (a shared claim is in use until its last hinted pod
    ends); a pod's entries go when the pod does, so nothing outlives the pods that made it."""

    __slots__ = ("_by_claim",)

    def __init__(self) -> None:
        self._by_claim: dict[str, dict[str, float]] = {}

    def set(self, pod_uid: str, claim_keys: Iterable[str], end: float | None) -> None:
        """The pod (referencing `claim_keys`) is expected to end at `end`; None: no (more) hint."""
        for key in claim_keys:
            pods = self._by_claim.get(key)
            if end is not None:
                self._by_claim.setdefault(key, {})[pod_uid] = end
            elif pods is not None:
                pods.pop(pod_uid, None)
                if not pods:
                    del self._by_claim[key]

    def end(self, claim_key: str) -> float | None:
        """The claim's expected end: the latest of its hinted pods'; None if none is hinted."""
        pods = self._by_claim.get(claim_key)
        return max(pods.values()) if pods else None

    def of_pod(self, pod_uid: str, claim_keys: Iterable[str]) -> float | None:
        """The end recorded for this pod (on any of its claims), if any."""
        ends = [e for k in claim_keys if (e := self._by_claim.get(k, {}).get(pod_uid)) is not None]
        return max(ends) if ends else None

    def __len__(self) -> int:
        return len(self._by_claim)


__all__ = [
    "ACCEPTED_FORMS",
    "ClaimEnds",
    "DurationError",
    "decision_hint",
    "parse_duration",
    "pod_duration",
    "running_end",
]
