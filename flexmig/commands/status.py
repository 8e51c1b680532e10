"""`flexmig status`: every GPU's slice map, drawn from the API: who holds which placement, what still fits.

One-shot: lists the driver's ResourceSlices and every ResourceClaim once (raw JSON, paged), and the
Pods too when some allocated claim does not name its pod itself, reads who holds what with
controller/views/statusmodel.py and renders it with controller/views/statusview.py. Credentials come
from `--kubeconfig`, else $KUBECONFIG, else ~/.kube/config, else the in-cluster service account. Any
failure to reach or read the API is one line on stderr naming the problem, and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from api.constants import DRIVER_NAME, is_dns_label
from driver.transportretry import with_safe_retries
from flexmig.cliargs import float_in

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
PODS = "/api/v1/pods"
PAGE = 500
MAX_TIMEOUT_S = 3600.0  # an hour per request is already a hung API server


class StatusError(Exception):
    """A problem worth one line to the user (no traceback)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="draw every GPU's MIG slice map: taken placements, free slices, what still fits",
        description=(
            "List the flexmig ResourceSlices, ResourceClaims and Pods once and draw, per GPU, which "
            "memory-slice placements are taken by which claim and pod, which are free, the "
            "fragmentation, and how many instances of each allowed profile still fit."
        ),
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster config)",
    )
    parser.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    parser.add_argument("--node", default=None, metavar="NAME", help="only this node's GPUs")
    parser.add_argument(
        "--controller-namespace",
        type=namespace_name,
        default="flexmig-system",
        metavar="NS",
        help="the namespace flexmig is installed in, where the controller keeps the devices it holds "
        "for waiting pods (default flexmig-system)",
    )
    parser.add_argument(
        "--no-color",
        action="store_true",
        help="plain text (default: colour when stdout is a terminal and NO_COLOR is unset)",
    )
    parser.add_argument(
        "--timeout",
        type=float_in(0, MAX_TIMEOUT_S, "seconds per API request", lo_open=True),
        default=15.0,
        help=f"seconds per API request, above 0 and at most {MAX_TIMEOUT_S:g} (default 15)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "yaml"),
        default="text",
        help="text (the slice maps, default) or the same as a JSON / YAML document for scripts",
    )
    parser.set_defaults(func=run)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A `kubernetes.client.ApiClient` for the chosen credentials; StatusError if they cannot be loaded."""
    from kubernetes import client as k8s
    from kubernetes import config as kconfig

    conf = with_safe_retries(k8s.Configuration())
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    if path is None and Path("~/.kube/config").expanduser().is_file():
        path = str(Path("~/.kube/config").expanduser())
    if path is None:
        try:
            kconfig.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        except kconfig.ConfigException as exc:
            raise StatusError(
                f"no kubeconfig ($KUBECONFIG unset, no ~/.kube/config) and not in a cluster: {_describe(exc)}"
            ) from exc
        return k8s.ApiClient(conf)
    for part in path.split(os.pathsep):
        if part and not Path(part).expanduser().is_file():
            raise StatusError(f"kubeconfig {part} does not exist")
    try:
        return kconfig.new_client_from_config(config_file=path, context=context, client_configuration=conf)  # type: ignore[no-untyped-call]
    except Exception as exc:  # ConfigException, YAML and key errors: all mean a bad file
        raise StatusError(f"cannot load kubeconfig {path}: {_describe(exc)}") from exc


def list_all(api: Any, path: str, timeout_s: float, field_selector: str = "") -> list[dict[str, Any]]:
    """Every item of a list endpoint, following `continue` tokens; StatusError on any failure."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from controller.kube.rest import request

    what = path.rsplit("/", 1)[-1]
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        query = [("limit", str(PAGE))]
        if token:
            query.append(("continue", token))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        try:
            body = request(api, "GET", path, query=query, timeout_s=timeout_s)
        except ApiException as exc:
            raise StatusError(
                f"listing {what} failed: API server answered {exc.status} {exc.reason}".rstrip()
            ) from exc
        except (HTTPError, OSError) as exc:
            host = getattr(getattr(api, "configuration", None), "host", "the API server")
            raise StatusError(f"cannot reach the API server at {host}: {_describe(exc)}") from exc
        except ValueError as exc:  # not JSON: something else answers at that address
            raise StatusError(f"listing {what} failed: the answer is not JSON ({_describe(exc)})") from exc
        items.extend(body.get("items") or ())
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def namespace_name(text: str) -> str:
    """An argparse type: a namespace name (a DNS label: it goes into the request's path)."""
    if not is_dns_label(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace name; allowed: lowercase letters, digits and '-', at most 63"
        )
    return text


def room_state(api: Any, namespace: str, timeout_s: float) -> tuple[Any, str | None]:
    """The controller's room-state document (devices held for waiting pods; None: there is none) and a
    note when it could not be read. Only the controller's own namespace is read: a map of that name
    elsewhere is anybody's."""
    import json

    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from controller.kube.rest import config_map_path, request
    from controller.kube.roomstore import KEY, ROOM_STATE_NAME

    where = f"{namespace}/{ROOM_STATE_NAME}"
    try:
        cm = request(api, "GET", config_map_path(namespace, ROOM_STATE_NAME), timeout_s=timeout_s)
    except ApiException as exc:
        if exc.status == 404:
            return None, None
        return None, f"(devices held for waiting pods not shown: reading {where}: {exc.status} {exc.reason})"
    except (HTTPError, OSError, ValueError) as exc:
        return None, f"(devices held for waiting pods not shown: reading {where}: {_describe(exc)})"
    try:
        return json.loads((cm.get("data") or {}).get(KEY) or "null"), None
    except ValueError:
        return None, f"(devices held for waiting pods not shown: {where} is not JSON)"


def run(args: argparse.Namespace) -> int:
    from controller.state.inventory import Inventory
    from controller.views.statusheld import held_document, held_lines, held_rows
    from controller.views.statusmodel import collect_allocations
    from controller.views.statusview import render

    try:
        api = api_client(args.kubeconfig, args.context)
        try:
            selector = f"spec.driver={DRIVER_NAME}"
            if args.node:
                selector += f",spec.nodeName={args.node}"
            slices = list_all(api, SLICES, args.timeout, selector)
            claims = list_all(api, CLAIMS, args.timeout)
            allocations = collect_allocations(claims)
            holders = [
                *allocations.holders.values(),
                *(share.holder for held in allocations.shares.values() for share in held),
            ]
            if any(not h.pods for h in holders):
                # Some claim names no pod itself (not reserved yet, not generated): find who references it.
                allocations = collect_allocations(claims, list_all(api, PODS, args.timeout))
            doc, note = room_state(api, args.controller_namespace, args.timeout)
        finally:
            api.close()
    except StatusError as exc:
        print(f"flexmig status: {exc}", file=sys.stderr)
        return 2
    if args.output != "text":
        import json

        import yaml

        from controller.views.statusdata import status_document

        out = status_document(Inventory(slices), allocations, node=args.node)
        out["held"] = held_document(held_rows(doc, args.node))
        if note:
            print(note, file=sys.stderr)
        text = (
            json.dumps(out, indent=2) + "\n"
            if args.output == "json"
            else yaml.safe_dump(out, sort_keys=False)
        )
        sys.stdout.write(text)
        return 0
    color = not args.no_color and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    text = render(Inventory(slices), allocations, color=color, node=args.node)
    print(text)
    for line in held_lines(held_rows(doc, args.node), note):
        print(line)
    return 0
