"""What a failed write tells us about the server: not applied, or unknown.

A write whose response never arrived may have landed. Treating it as failed is how one device ends up
in two claims: the ledger frees what the server still holds. So every error of a write is sorted here:

- `NOT_APPLIED`: the server answered and refused (4xx: 409 conflict, 404, 422, 403, 429), or the
  connection could not be opened at all (nothing was sent). The object is as it was.
- `UNKNOWN`: anything else. A timeout or a connection dropped after the request was sent, and 5xx: the
  API server answers 500 when etcd timed out and 504 when its own deadline passed, and in both cases
  the write may still commit. Until a read or the watch shows a version newer than the one the write
  was based on, the write is taken as possibly applied.
"""

from __future__ import annotations

import enum

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, NewConnectionError


class NotSent(Exception):
    """The write was refused before anything left this process (e.g. not the leader)."""


class Outcome(enum.Enum):
    NOT_APPLIED = "not-applied"
    UNKNOWN = "unknown"


def _never_connected(exc: BaseException) -> bool:
    if isinstance(exc, MaxRetryError):
        exc = exc.reason if exc.reason is not None else exc
    return isinstance(exc, NewConnectionError | ConnectTimeoutError | ConnectionRefusedError)


def write_outcome(exc: BaseException) -> Outcome:
    """What an exception raised by a write means for the object it was sent for."""
    if isinstance(exc, NotSent):
        return Outcome.NOT_APPLIED
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return Outcome.NOT_APPLIED if 400 <= status < 500 else Outcome.UNKNOWN
    if _never_connected(exc):
        return Outcome.NOT_APPLIED
    return Outcome.UNKNOWN


def is_unknown(exc: BaseException) -> bool:
    return write_outcome(exc) is Outcome.UNKNOWN


__all__ = ["NotSent", "Outcome", "is_unknown", "write_outcome"]
