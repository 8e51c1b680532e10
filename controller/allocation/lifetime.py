"""A pod's lifetime hint: the `gpu.flexmig.dev/expected-duration` annotation -> an expected end.

The MIG policy (driver/policy/allocator.py `PackingPolicy.colocation`) prefers, for a pod with an
expected end, GPUs whose running pods end no earlier, so that GPUs empty out together and free whole
for large requests. The hint is advisory: a missing annotation means no hint, and a value that cannot
be read (or is not positive) also means no hint, with a warning naming the annotation, the value and
the accepted forms; the pod is placed either way.

Times are wall-clock seconds since the epoch, the clock both a decision (`decision_hint`: the pod
has not started, so it ends a duration from now) and the ledger's view of running pods
(`running_end`: from the pod's start, else its creation) use.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
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


def running_end(pod: Mapping[str, Any], now: float) -> float | None:
    """When a pod that holds devices is expected to end: its start (status.startTime, else
    metadata.creationTimestamp, else `now`) plus its annotated duration; None without a good one."""
    seconds, _ = pod_duration(pod)
    if seconds is None:
        return None
    began = _timestamp((pod.get("status") or {}).get("startTime"))
    if began is None:
        began = _timestamp((pod.get("metadata") or {}).get("creationTimestamp"))
    return (now if began is None else began) + seconds


__all__ = [
    "ACCEPTED_FORMS",
    "DurationError",
    "decision_hint",
    "parse_duration",
    "pod_duration",
    "running_end",
]
