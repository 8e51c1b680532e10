"""HAMi-core on a hami-core node: is the library there, and the per-claim host state it needs.

When the library is absent a share cannot be enforced. A production user expects the pod to start
anyway (refusing would make a node that is only missing a file unusable) but must be able to see that
the limits are advisory, so the plugin says so everywhere it can:
- at start, a structured warning naming the path and what to do;
- `flexmig_hami_core_library_present{node}` = 0 (1 when usable), re-checked at every prepare and
  every scrape, so installing the library later takes effect without a restart;
- at every prepare of a shared GPU, a warning that this claim is unenforced. The limit variables are
  still set in the container, so the intended share stays visible there.
The library check is cheap (open + 4 bytes), so doing it per prepare costs nothing measurable.
"""

from __future__ import annotations

import threading

import structlog

from driver import hamicore
from driver.hamicore import HamiCorePaths, LibraryCheck, ShareLimit
from kubeletplugin.agent.metrics import NodeMetrics

log = structlog.get_logger(__name__)


class HamiCoreSupport:
    def __init__(self, paths: HamiCorePaths, node_name: str, metrics: NodeMetrics) -> None:
        self.paths = paths
        self._node = node_name
        self._metrics = metrics
        self._lock = threading.Lock()
        self._last: bool | None = None

    def check(self) -> LibraryCheck:
        """Check the library, update the metric, log when the answer changes (and the first time)."""
        result = hamicore.check_library(self.paths.library)
        self._metrics.hami_core_library_present.labels(node=self._node).set(1 if result.present else 0)
        with self._lock:
            changed = result.present != self._last
            self._last = result.present
        if result.present:
            # The preload file must exist before a container mounts it; cheap when already right.
            try:
                hamicore.write_preload_file(self.paths)
            except OSError as exc:
                log.error(
                    "cannot write the ld.so.preload file", path=str(self.paths.preload_file), error=str(exc)
                )
                raise
            if changed:
                log.info("HAMi-core library found: shared GPUs are enforced", library=str(self.paths.library))
        elif changed:
            log.warning(
                "HAMi-core library not usable: GPU shares cannot be enforced (see --unenforced-shares)",
                library=str(self.paths.library),
                reason=result.reason,
                fix="install HAMi-core's libvgpu.so at this host path (or set --hami-core-library)",
                metric="flexmig_hami_core_library_present",
            )
        return result

    def claim_edits(self, claim_uid: str, shares: list[ShareLimit]) -> dict[str, object]:
        """Create the claim's host dirs and return its spec-level CDI edits."""
        library = self.check()
        if not library.present:
            log.warning(
                "claim's GPU shares are NOT enforced: HAMi-core library missing; limits only set as env",
                uid=claim_uid,
                reason=library.reason,
            )
        hamicore.prepare_claim_dirs(self.paths, claim_uid)
        return hamicore.claim_edits(self.paths, claim_uid, shares, library.present)

    def release(self, claim_uid: str) -> None:
        if hamicore.remove_claim_dir(self.paths, claim_uid):
            log.info("removed the claim's HAMi-core cache dir", uid=claim_uid)
