"""A strict RFC 6902 applier (add/remove/replace/test) and pod builders for the shim tests.

Strict on purpose: a path whose parent is missing, a list index past the end or a remove of a missing
member is an error here as it is in the API server's patcher, so a patch that only "works" with a
lenient applier fails the test.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from controller.shim import MutationResult, ShimDefaults, mutate_pod


class PatchError(ValueError):
    pass


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} does not start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"{token!r} is not a list index")
    i = int(token)
    if i > len(container) or (not for_add and i == len(container)):
        raise PatchError(f"index {i} out of range (length {len(container)})")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for t in tokens[:-1]:
        if isinstance(node, dict):
            if t not in node:
                raise PatchError(f"member {t!r} missing")
            node = node[t]
        elif isinstance(node, list):
            node = node[_index(node, t, for_add=False)]
        else:
            raise PatchError(f"cannot descend into {node!r}")
    return node


def apply_patch(doc: Any, patch: list[dict[str, Any]]) -> Any:
    out = copy.deepcopy(doc)
    for op in patch:
        tokens = _tokens(op["path"])
        if not tokens:
            raise PatchError("whole-document ops are not used by the shim")
        parent, last = _parent(out, tokens), tokens[-1]
        kind = op["op"]
        if kind == "add":
            if isinstance(parent, dict):
                parent[last] = copy.deepcopy(op["value"])
            elif isinstance(parent, list):
                parent.insert(_index(parent, last, for_add=True), copy.deepcopy(op["value"]))
            else:
                raise PatchError(f"add into {parent!r}")
        elif kind in ("remove", "replace"):
            if isinstance(parent, dict):
                if last not in parent:
                    raise PatchError(f"{kind} of missing member {last!r}")
                if kind == "remove":
                    del parent[last]
                else:
                    parent[last] = copy.deepcopy(op["value"])
            elif isinstance(parent, list):
                i = _index(parent, last, for_add=False)
                if kind == "remove":
                    del parent[i]
                else:
                    parent[i] = copy.deepcopy(op["value"])
            else:
                raise PatchError(f"{kind} in {parent!r}")
        elif kind == "test":
            value = parent[last] if isinstance(parent, dict) else parent[_index(parent, last, for_add=False)]
            if value != op["value"]:
                raise PatchError(f"test failed at {op['path']}")
        else:
            raise PatchError(f"op {kind!r} not supported")
    return out


def container(name: str, limits: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "ubuntu:22.04"}
    if limits is not None:
        c["resources"] = {"limits": dict(limits)}
    c.update(extra)
    return c


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    mode: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod", "namespace": "ns1"},
        "spec": {"containers": list(containers), **spec},
    }
    if mode is not None:
        p["metadata"]["annotations"] = {"nvidia.com/vgpu-mode": mode}
    if init is not None:
        p["spec"]["initContainers"] = init
    return p


def never_ours(_claim: Mapping[str, Any]) -> bool | None:
    return False


def mutate(
    p: Mapping[str, Any],
    defaults: ShimDefaults | None = None,
    lookup: Callable[[Mapping[str, Any]], bool | None] = never_ours,
) -> tuple[MutationResult, dict[str, Any]]:
    """Mutate and apply: (result, the pod as the API server would store it)."""
    result = mutate_pod(p, "ns1", defaults or ShimDefaults(), lookup)
    return result, apply_patch(p, result.patch)


def legacy_keys_left(p: Mapping[str, Any]) -> list[str]:
    left = []
    for field in ("initContainers", "containers"):
        for c in p["spec"].get(field) or []:
            for part in ("limits", "requests"):
                left += [
                    f"{c['name']}.{part}.{k}"
                    for k in (c.get("resources") or {}).get(part) or {}
                    if k.startswith("nvidia.com/")
                ]
    return left
