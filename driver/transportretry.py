"""The one retry policy of every API-server connection flexmig opens (controller, kubelet plugin, CLI).

urllib3's default re-sends PUT and DELETE (it counts them idempotent) and, through the `kubernetes`
client, a PATCH or POST too when the connection broke after the request went out. A write whose
response was lost may have landed: re-sending it turns one success into a 409 or a duplicate, and the
caller then believes the write failed. So the transport re-sends a request only when that is harmless:
- any method after a failed connect (nothing was sent);
- GET/HEAD after a read error or a cut connection (reads change nothing).
Status codes are never retried here: a 429 or 5xx reaches the caller, whose loop backs off
(driver/backoff.py) and, for a write, decides from what it knows (controller/kube/outcome.py).

Per-request policies (controller/kube/rest.py) override this one; this is the floor for every call made
through the generated client's typed methods.
"""

from __future__ import annotations

from urllib3.util.retry import Retry

READ_METHODS = frozenset({"GET", "HEAD"})

TRANSPORT_RETRIES = Retry(
    total=3,
    connect=3,
    read=3,
    other=0,
    status=0,
    redirect=0,
    allowed_methods=READ_METHODS,
    raise_on_status=False,
)


def with_safe_retries(configuration: object) -> object:
    """`configuration` (a kubernetes.client.Configuration) with the policy above; returned for chaining.
    Must be set before the ApiClient is made: its connection pool copies the policy once."""
    configuration.retries = TRANSPORT_RETRIES  # type: ignore[attr-defined]
    return configuration
