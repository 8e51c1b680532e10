"""The ConfigMap that carries preemption's and moves' promises from one leader to the next.

One ConfigMap, `flexmig-room-state` in the controller's namespace, key `state.json`: the document of
controller/allocation/roomstate.py. Only the leader writes it (every write goes through the Writer:
leadership and the write budget are checked first), and only when the document changed. Users who
may create pods have no business in the controller's namespace, so nothing a pod's owner writes can
make the controller hold devices: that is why the state is not kept in pod annotations.

Lost answers: every write is a full replacement carrying the resourceVersion it was based on. When a
write's answer is lost (or refused with 409), what the server holds is unknown: the next save reads
the map first and writes only if it differs, so a write that landed is never sent again blindly and
one that did not land is sent on the next step.

Bounds: the document is refused above `MAX_BYTES` (a ConfigMap holds at most 1 MiB), when written
(`TooBig`: controller/allocation/roomsync.py then keeps the newest nominations that fit) and when read
back.
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from controller.kube.outcome import NotSent
from controller.kube.writer import Writer, is_conflict, is_not_found

log = structlog.get_logger(__name__)

ROOM_STATE_NAME = "flexmig-room-state"
KEY = "state.json"
MAX_BYTES = 768 * 1024


class RoomStoreError(ValueError):
    """The stored map cannot be read as a document (not JSON, too big, wrong key)."""


class TooBig(RoomStoreError):
    """A document to write over `MAX_BYTES`: nothing was sent."""


def _encode(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class RoomStore:
    def __init__(self, writer: Writer, namespace: str, name: str = ROOM_STATE_NAME) -> None:
        self.writer, self.namespace, self.name = writer, namespace, name
        self._known = False  # whether _rv/_stored reflect what the server holds
        self._rv: str | None = None  # None with _known: the map does not exist
        self._stored: str | None = None

    def absent(self) -> bool:
        """The last read or write found no map."""
        return self._known and self._rv is None

    def load(self) -> Any | None:
        """The stored document (None: there is none). Raises on a failed read (the caller retries);
        RoomStoreError when what is stored is not a document."""
        if not self._read():
            return None
        text = self._stored
        if text is None:
            raise RoomStoreError(f"configmap {self.namespace}/{self.name}: no data.{KEY}")
        if len(text.encode()) > MAX_BYTES:
            raise RoomStoreError(f"configmap {self.namespace}/{self.name} data.{KEY}: over {MAX_BYTES} bytes")
        try:
            return json.loads(text)
        except ValueError as exc:
            raise RoomStoreError(
                f"configmap {self.namespace}/{self.name} data.{KEY}: not JSON ({exc})"
            ) from exc

    def save(self, doc: Any) -> bool:
        """Write `doc` if the map does not already hold it; True when a write landed. Raises NotLeader
        (nothing sent), RoomStoreError (too big: nothing sent), or the write's error (then what the
        server holds is read again before the next write)."""
        text = _encode(doc)
        if len(text.encode()) > MAX_BYTES:
            raise TooBig(f"room state of {len(text.encode())} bytes exceeds {MAX_BYTES}: not written")
        if self._known and self._stored == text:
            return False
        if not self._known:
            self._read()
            if self._stored == text:
                return False
        try:
            self._write(text)
        except NotSent:
            raise
        except ApiException as exc:
            self._known = False
            if is_conflict(exc) or is_not_found(exc):  # changed or gone under us: read, write once more
                self._read()
                if self._stored == text:
                    return False
                self._write(text)
                return True
            raise
        except Exception:
            self._known = False  # the answer is lost: it may have landed
            raise
        return True

    def _read(self) -> bool:
        """What the server holds now, into _rv/_stored; False when the map does not exist."""
        try:
            obj = self.writer.read_config_map(self.namespace, self.name)
        except ApiException as exc:
            if not is_not_found(exc):
                raise
            self._known, self._rv, self._stored = True, None, None
            return False
        text = (obj.get("data") or {}).get(KEY)
        self._known, self._rv = True, str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        self._stored = text if isinstance(text, str) else None
        return True

    def _write(self, text: str) -> None:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/managed-by": "flexmig-controller"},
        }
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {KEY: text}}
        if self._rv is None:
            out = self.writer.create_config_map(self.namespace, body)
        else:
            meta["resourceVersion"] = self._rv
            out = self.writer.replace_config_map(self.namespace, self.name, body)
        self._known, self._stored = True, text
        self._rv = str((out.get("metadata") or {}).get("resourceVersion") or "") or None


__all__ = ["KEY", "MAX_BYTES", "ROOM_STATE_NAME", "RoomStore", "RoomStoreError", "TooBig"]
