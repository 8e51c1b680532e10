"""Writes and removes the per-claim CDI spec, with what the host must provide for it.

The spec itself is built in `driver.cdi` (pure); this module adds the side effects around it: the MIG
capability device nodes a MIG device needs are created first (kubeletplugin/prepare/devnodes.py), then the spec
is written atomically into the CDI directory the runtime reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from driver import cdi
from driver.cdi_host import DeviceTable, DriverFiles, discover_driver_files, read_char_majors
from kubeletplugin.prepare.devnodes import ensure_caps_nodes

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ClaimSpecWriter:
    cdi_dir: Path
    mig_minors: Mapping[str, int] | None = None
    host: cdi.SpecHost = field(default_factory=cdi.SpecHost)

    def write(
        self,
        claim_uid: str,
        devices: Sequence[cdi.PreparedDevice],
        spec_edits: Mapping[str, object] | None,
        *,
        durable: bool = True,
    ) -> Path:
        """Write the claim's spec atomically; `durable` fsyncs it and its directory too."""
        minors: list[int] = []
        for dev in devices:
            if isinstance(dev, cdi.PreparedMig):
                minors += cdi.mig_cap_minors(dev.gpu_minor, dev.gi_id, dev.ci_id, self.mig_minors)
        ensure_caps_nodes(self.host.devices, minors)
        spec = cdi.build_claim_spec(claim_uid, devices, self.mig_minors, spec_edits, self.host)
        return cdi.write_spec_atomically(self.cdi_dir, claim_uid, spec, durable=durable)

    def remove(self, claim_uid: str) -> bool:
        return cdi.remove_spec(self.cdi_dir, claim_uid)


def host_spec_writer(
    *,
    cdi_dir: Path,
    dev_root: Path,
    driver_root: Path,
    proc_root: Path,
    cdi_hook: str,
    simulated: bool,
    proc_root_is_default: bool,
    container_dev_root: Path | None = None,
    container_driver_root: Path | None = None,
    container_cdi_hook: str | None = None,
) -> ClaimSpecWriter:
    """The writer for this node: device numbers, mig-minors and driver files read from the host.

    `dev_root`, `driver_root` and `cdi_hook` are host paths, written into the specs; the `container_`
    ones are where this process sees the same files (None: the same path, as for a host process).

    With the simulator, the host's own /proc describes other (real) GPUs, if any: it is only read when a
    proc root was set explicitly (a test's stand-in), so simulated instances never create nodes in the
    machine's real /dev/nvidia-caps; without it the kernel formula gives the minors and no caps nodes are
    written (there is no nvidia-caps driver to describe them).
    """
    use_proc = not simulated or not proc_root_is_default
    majors = read_char_majors(proc_root) if use_proc else {}
    minors = cdi.read_mig_minors(proc_root / "driver" / "nvidia-caps" / "mig-minors") if use_proc else None
    driver: DriverFiles = discover_driver_files(
        driver_root, cdi_hook, local_driver_root=container_driver_root, local_hook_path=container_cdi_hook
    )
    for warning in driver.warnings:
        if simulated and driver.missing_required and "nvidia-cdi-hook" not in warning:
            log.info("simulated GPUs: " + warning)
        else:
            log.warning(warning)
    if not simulated and driver.missing_required:
        log.error("CDI specs will lack the driver libraries", missing=list(driver.missing_required))
    table = DeviceTable(dev_root, majors, strict=not simulated, local_dev_root=container_dev_root)
    log.info(
        "CDI host layout",
        dev_root=str(dev_root),
        container_dev_root=str(container_dev_root or dev_root),
        driver_root=str(driver_root),
        container_driver_root=str(container_driver_root or driver_root),
        proc_root=str(proc_root) if use_proc else None,
        nvidia_caps_major=table.caps_major,
        mig_minors_table=minors is not None,
        driver_files=len(driver.mounts),
        cdi_hook=driver.hook,
    )
    return ClaimSpecWriter(cdi_dir, minors, cdi.SpecHost(table, driver))
