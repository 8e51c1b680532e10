"""DRAPlugin servicers (kubelet DRA gRPC v1 and v1beta1).

Both versions have identical messages, so one converter serves both; only the generated modules
differ. The servicers never let an exception escape an RPC: kubelet treats a failed RPC as a
failure of every claim in it, whereas a per-claim error lets the healthy claims proceed and makes
kubelet retry just the failing ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, TypeVar

import structlog

from api.gen.dra_v1 import api_pb2 as v1_pb2
from api.gen.dra_v1 import api_pb2_grpc as v1_grpc
from api.gen.dra_v1beta1 import api_pb2 as v1beta1_pb2
from api.gen.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc

from .interfaces import ClaimPreparer, ClaimRef, PrepareResult

log = structlog.get_logger(__name__)

R = TypeVar("R")

MISSING_RESULT_ERROR = "driver returned no result for this claim"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _unique_claims(pb_claims: Any) -> list[ClaimRef]:
    # kubelet never repeats a claim within one call, but a duplicate would otherwise make a
    # preparer do the work twice and the response map silently keep one answer.
    seen: dict[str, ClaimRef] = {}
    for c in pb_claims:
        seen.setdefault(c.uid, ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name))
    return list(seen.values())


def _call_isolated(
    op: str,
    fn: Callable[[list[ClaimRef]], Mapping[str, R]],
    claims: list[ClaimRef],
) -> tuple[dict[str, R], dict[str, str]]:
    """Run fn on all claims; if it raises, retry claim by claim so one bad claim fails alone.

    Retrying is sound because prepare and unprepare are idempotent by contract. Returns the
    results and, separately, the errors of the claims whose call raised.
    """
    if not claims:
        return {}, {}

    def call(batch: list[ClaimRef]) -> dict[str, R]:
        # dict() also turns a result of the wrong type (None, a list) into an exception here,
        # where it is contained, instead of later while building the response.
        return dict(fn(batch))

    try:
        return call(claims), {}
    except Exception as exc:
        if len(claims) == 1:
            log.exception(f"{op} failed", claim_uid=claims[0].uid)
            return {}, {claims[0].uid: _describe(exc)}
        log.warning(f"{op} of a batch failed; retrying claim by claim", error=_describe(exc))
    results: dict[str, R] = {}
    errors: dict[str, str] = {}
    for claim in claims:
        try:
            one = call([claim])
        except Exception as exc:
            log.exception(f"{op} failed", claim_uid=claim.uid)
            errors[claim.uid] = _describe(exc)
            continue
        if claim.uid in one:
            results[claim.uid] = one[claim.uid]
    return results, errors


def _check_no_extra(op: str, claims: list[ClaimRef], returned: Mapping[str, object]) -> None:
    extra = returned.keys() - {c.uid for c in claims}
    if extra:
        # Answering for a claim kubelet did not ask about could mislead it; drop and report.
        log.warning(f"{op} returned results for claims that were not requested", claim_uids=sorted(extra))


def prepare_into(pb: ModuleType, preparer: ClaimPreparer, request: Any) -> Any:
    """NodePrepareResourcesRequest -> NodePrepareResourcesResponse of the same API module."""
    claims = _unique_claims(request.claims)
    results, errors = _call_isolated("prepare", preparer.prepare, claims)
    _check_no_extra("prepare", claims, results)
    response = pb.NodePrepareResourcesResponse()
    for claim in claims:
        entry = response.claims[claim.uid]
        if claim.uid in errors:
            entry.error = errors[claim.uid]
            continue
        result = results.get(claim.uid)
        if result is None:
            entry.error = MISSING_RESULT_ERROR
            continue
        try:
            _fill_prepare_entry(pb, entry, result)
        except Exception as exc:
            # A malformed result (wrong types) must not take the other claims down with it.
            log.exception("prepare returned an unusable result", claim_uid=claim.uid)
            entry.Clear()
            entry.error = f"driver returned an invalid result: {_describe(exc)}"
    return response


def _fill_prepare_entry(pb: ModuleType, entry: Any, result: PrepareResult) -> None:
    if result.error:
        # kubelet ignores devices on error; sending none keeps the answer unambiguous.
        entry.error = result.error
        return
    for d in result.devices:
        entry.devices.append(
            pb.Device(
                request_names=list(d.request_names),
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=list(d.cdi_device_ids),
            )
        )


def unprepare_into(pb: ModuleType, preparer: ClaimPreparer, request: Any) -> Any:
    """NodeUnprepareResourcesRequest -> NodeUnprepareResourcesResponse of the same API module."""
    claims = _unique_claims(request.claims)
    results, errors = _call_isolated("unprepare", preparer.unprepare, claims)
    _check_no_extra("unprepare", claims, results)
    response = pb.NodeUnprepareResourcesResponse()
    for claim in claims:
        entry = response.claims[claim.uid]
        if claim.uid in errors:
            entry.error = errors[claim.uid]
        elif claim.uid not in results:
            entry.error = MISSING_RESULT_ERROR
        else:
            entry.error = str(results[claim.uid] or "")
    return response


def _log_outcome(op: str, response: Any) -> None:
    failed = {uid: r.error for uid, r in response.claims.items() if r.error}
    log.info(op, claims=len(response.claims), failed=failed or None)


class DRAPluginV1Servicer(v1_grpc.DRAPluginServicer):
    """k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin, the version kubelet prefers since 1.34."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    def NodePrepareResources(
        self, request: v1_pb2.NodePrepareResourcesRequest, context: Any
    ) -> v1_pb2.NodePrepareResourcesResponse:
        response: v1_pb2.NodePrepareResourcesResponse = prepare_into(v1_pb2, self._preparer, request)
        _log_outcome("NodePrepareResources v1", response)
        return response

    def NodeUnprepareResources(
        self, request: v1_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> v1_pb2.NodeUnprepareResourcesResponse:
        response: v1_pb2.NodeUnprepareResourcesResponse = unprepare_into(v1_pb2, self._preparer, request)
        _log_outcome("NodeUnprepareResources v1", response)
        return response


class DRAPluginV1Beta1Servicer(v1beta1_grpc.DRAPluginServicer):
    """k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin, for kubelets older than 1.34."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    def NodePrepareResources(
        self, request: v1beta1_pb2.NodePrepareResourcesRequest, context: Any
    ) -> v1beta1_pb2.NodePrepareResourcesResponse:
        response: v1beta1_pb2.NodePrepareResourcesResponse = prepare_into(
            v1beta1_pb2, self._preparer, request
        )
        _log_outcome("NodePrepareResources v1beta1", response)
        return response

    def NodeUnprepareResources(
        self, request: v1beta1_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> v1beta1_pb2.NodeUnprepareResourcesResponse:
        response: v1beta1_pb2.NodeUnprepareResourcesResponse = unprepare_into(
            v1beta1_pb2, self._preparer, request
        )
        _log_outcome("NodeUnprepareResources v1beta1", response)
        return response


def add_dra_servicers(server: Any, preparer: ClaimPreparer) -> None:
    """Register both DRAPlugin versions on a grpc.Server."""
    v1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1Servicer(preparer), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1Beta1Servicer(preparer), server)
