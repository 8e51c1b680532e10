"""The Helm chart's rendered objects against the real API server, without installing them.

Every rendered object passes the API server's validation (server-side apply, dryRun=All): CEL in
DeviceClasses, webhook matchConditions and ValidatingAdmissionPolicies is compiled there.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from .chart_render import (
    OVERRIDES,
    Raw,
    api_error,
    render,
)
from .cluster import ControlPlane
from .k8sobjects import create_namespace


@pytest.mark.parametrize("variant", ["defaults", "overrides"])
def test_rendered_objects_pass_server_side_validation(
    control_plane: ControlPlane, helm_bin: Path, tmp_path: Path, variant: str
) -> None:
    namespace = f"flexmig-dryrun-{variant}"
    extra = OVERRIDES if variant == "overrides" else ()
    docs = render(helm_bin, tmp_path, *extra, namespace=namespace, release=f"dry-{variant}")
    with control_plane.api_client() as api:
        with contextlib.suppress(ApiException):  # a rerun in the same session finds it
            create_namespace(api, namespace)
        raw = Raw(api)
        failures = []
        # A Pod (the `helm test` hook) is admitted only if its ServiceAccount exists; a dry run
        # creates none, so that one is created for real first.
        pod_accounts = {d["spec"].get("serviceAccountName") for d in docs if d["kind"] == "Pod"}
        made = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] in pod_accounts]
        try:
            for obj in made:
                raw.apply(obj, dry_run=False)
            for obj in docs:
                try:
                    raw.apply(obj, dry_run=True)
                except ApiException as exc:
                    failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.status} {api_error(exc)}")
        finally:
            for obj in made:
                with contextlib.suppress(ApiException):
                    raw.request(
                        "DELETE", f"/api/v1/namespaces/{namespace}/serviceaccounts/{obj['metadata']['name']}"
                    )
        assert not failures, "the API server rejected rendered objects:\n" + "\n".join(failures)
