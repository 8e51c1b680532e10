"""An in-memory API server for the webhook's unit tests, in place of `controller.kube.rest.request`.

It keeps objects by path and enforces what the webhook relies on: 409 on creating an existing name
or writing with a stale resourceVersion, 404 on a missing object, delete preconditions, merge and
JSON patches (`test` included), list with a label-existence selector. `fail` injects errors.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from controller.webhook import cabundle, certstore, flexmigclaims, quotas, templates, templatesync

MODULES = (cabundle, certstore, flexmigclaims, quotas, templates, templatesync)


def _error(status: int, message: str) -> ApiException:
    return ApiException(status=status, reason=message, body=json.dumps({"message": message}))


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def _pointer(obj: Any, path: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    for p in parts[:-1]:
        obj = obj[int(p)] if isinstance(obj, list) else obj[p]
    return obj, parts[-1]


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[tuple[str, str], int] = {}
        self._rv = 0
        self.clock: Callable[[], float] = time.time
        """Source of creationTimestamp (epoch seconds)."""

    # --- helpers for tests ---

    def put(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as if created through the API (returns the stored copy)."""
        return self.request(None, "POST", collection, obj)

    def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "GET"]

    # --- the API ---

    def _stamp(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def request(
        self,
        _api: Any,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        self.calls.append((method, path))
        if (method, path) in self.fail:
            raise _error(self.fail[(method, path)], f"injected failure of {method} {path}")
        if method == "GET":
            if path in self.objects:
                return copy.deepcopy(self.objects[path])
            items = [copy.deepcopy(o) for p, o in sorted(self.objects.items()) if _in_collection(p, path)]
            for key, value in query or ():
                if key == "labelSelector":
                    items = [o for o in items if value in (o["metadata"].get("labels") or {})]
            if items or path.endswith("s"):
                return {"items": items}
            raise _error(404, f"{path} not found")
        if method == "POST":
            obj = copy.deepcopy(body)
            path = f"{path}/{obj['metadata']['name']}"
            if path in self.objects:
                raise _error(409, f"{path} already exists")
            obj["metadata"].setdefault("uid", str(uuid.uuid4()))
            obj["metadata"].setdefault(
                "creationTimestamp",
                dt.datetime.fromtimestamp(self.clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            self._stamp(obj)
            self.objects[path] = obj
            return copy.deepcopy(obj)
        if path not in self.objects:
            raise _error(404, f"{path} not found")
        current = self.objects[path]
        if method == "PUT":
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise _error(409, "the object has been modified")
            obj = copy.deepcopy(body)
            self._stamp(obj)
            self.objects[path] = obj
            return copy.deepcopy(obj)
        if method == "PATCH":
            obj = copy.deepcopy(current)
            if content_type == "application/json-patch+json":
                for op in body:
                    parent, key = _pointer(obj, op["path"])
                    if op["op"] == "test":
                        if parent[key] != op["value"]:
                            raise _error(422, f"test of {op['path']} failed")
                    elif op["op"] in ("add", "replace"):
                        parent[key] = copy.deepcopy(op["value"])
            else:
                _merge(obj, body)
            self._stamp(obj)
            self.objects[path] = obj
            return copy.deepcopy(obj)
        if method == "DELETE":
            pre = (body or {}).get("preconditions") or {}
            meta = current["metadata"]
            if pre.get("resourceVersion") not in (None, meta["resourceVersion"]) or pre.get("uid") not in (
                None,
                meta["uid"],
            ):
                raise _error(409, "precondition failed")
            del self.objects[path]
            return {"kind": "Status", "status": "Success"}
        raise AssertionError(f"unexpected {method} {path}")


def _in_collection(path: str, collection: str) -> bool:
    """Whether object `path` is in `collection`, cluster-wide lists included."""
    if path.rsplit("/", 1)[0] == collection:
        return True
    resource = collection.rsplit("/", 1)[-1]
    head = collection[: -len(resource)].rstrip("/")
    parts = path.split("/")
    return (
        "namespaces" not in collection and len(parts) >= 4 and parts[-2] == resource and path.startswith(head)
    )


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    api = FakeApi()
    for module in MODULES:
        monkeypatch.setattr(module, "request", api.request)
    yield api
