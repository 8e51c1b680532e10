"""Test-only kubelet plugin process: PluginServers with an in-memory preparer and a file-fed
health source, so component tests can talk to a real separate process over real unix sockets.

    python tests/component/grpc_plugin_entry.py --registry-dir D --plugins-dir D --state-dir D

Behaviour the tests rely on, chosen by claim name:
- "fail-*": the preparer reports an error for the claim;
- "raise-*": the preparer raises (in prepare and unprepare);
- "omit-*": the preparer leaves the claim out of its result;
- anything else gets the first free device of a fixed inventory, the same one on every retry.
State files in --state-dir: "ready" (written after start), "registrations.log" (one line per
successful registration callback), "health.json" (read by the health source).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

# Running as a script puts tests/component first on sys.path, not the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from api.constants import DRIVER_NAME, mig_device_name
from kubeletplugin.grpcserver import (
    ClaimRef,
    DeviceHealthState,
    Health,
    PluginServers,
    PreparedDevice,
    PrepareResult,
    RegistrationState,
    install_signal_handlers,
)

POOL = "node-a"
INVENTORY = (
    "gpu-0",
    mig_device_name(1, "1g.10gb", 19, 0),
    mig_device_name(1, "1g.10gb+me", 20, 1),
)


class InMemoryPreparer:
    """A real (if tiny) ClaimPreparer: allocates from INVENTORY, idempotent per claim UID."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_claim: dict[str, PreparedDevice] = {}
        self.calls: list[tuple[str, list[str]]] = []

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        with self._lock:
            self.calls.append(("prepare", [c.uid for c in claims]))
            out: dict[str, PrepareResult] = {}
            for claim in claims:
                if claim.name.startswith("raise-"):
                    raise RuntimeError(f"preparer exploded on {claim.name}")
                if claim.name.startswith("omit-"):
                    continue
                if claim.name.startswith("fail-"):
                    out[claim.uid] = PrepareResult(error=f"cannot prepare {claim.namespace}/{claim.name}")
                    continue
                device = self._by_claim.get(claim.uid) or self._allocate(claim)
                if device is None:
                    out[claim.uid] = PrepareResult(error="no free device")
                else:
                    out[claim.uid] = PrepareResult(devices=[device])
            return out

    def _allocate(self, claim: ClaimRef) -> PreparedDevice | None:
        used = {d.device_name for d in self._by_claim.values()}
        for name in INVENTORY:
            if name not in used:
                device = PreparedDevice(
                    request_names=["gpu"],
                    pool_name=POOL,
                    device_name=name,
                    cdi_device_ids=[f"k8s.{DRIVER_NAME}/claim={claim.uid}-{name}"],
                )
                self._by_claim[claim.uid] = device
                return device
        return None

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        with self._lock:
            self.calls.append(("unprepare", [c.uid for c in claims]))
            out: dict[str, str | None] = {}
            for claim in claims:
                if claim.name.startswith("raise-"):
                    raise RuntimeError(f"unpreparer exploded on {claim.name}")
                if claim.name.startswith("omit-"):
                    continue
                # Unknown claims are success: unprepare must be idempotent.
                self._by_claim.pop(claim.uid, None)
                out[claim.uid] = None
            return out

    def prepared(self) -> dict[str, str]:
        with self._lock:
            return {uid: d.device_name for uid, d in self._by_claim.items()}


class FileHealthSource:
    """HealthSource reading a JSON list of {device, health, message} from a file.

    Writers replace the file atomically (rename), so a change of inode or mtime means new content.
    """

    def __init__(self, path: Path, poll_s: float = 0.02) -> None:
        self._path = path
        self._poll_s = poll_s
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self._path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def snapshot(self) -> Sequence[DeviceHealthState]:
        self._seen = self._stamp()
        try:
            entries = json.loads(self._path.read_text())
        except FileNotFoundError:
            entries = []
        now = int(time.time())
        return [
            DeviceHealthState(
                pool_name=POOL,
                device_name=e["device"],
                health=Health[e["health"]],
                last_updated_unix_s=now,
                health_check_timeout_s=60,
                message=e.get("message", ""),
            )
            for e in entries
        ]

    def wait_for_change(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._stamp() != self._seen:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(self._poll_s, remaining))


def write_health(path: Path, entries: list[dict[str, str]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry-dir", required=True)
    parser.add_argument("--plugins-dir", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--grace-s", type=float, default=5.0)
    args = parser.parse_args(argv)

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    state_dir: Path = args.state_dir
    log_path = state_dir / "registrations.log"

    def on_registered() -> None:
        with log_path.open("a") as f:
            f.write("registered\n")

    servers = PluginServers(
        InMemoryPreparer(),
        health_source=FileHealthSource(state_dir / "health.json"),
        registration_state=RegistrationState(on_registered),
        registry_dir=args.registry_dir,
        plugins_dir=args.plugins_dir,
        health_poll_s=0.05,
    )
    install_signal_handlers(servers, grace_s=args.grace_s)
    servers.start()
    (state_dir / "ready").write_text(str(os.getpid()))
    # Event.wait with no timeout is interruptible by signals, so the handlers run promptly.
    servers.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
