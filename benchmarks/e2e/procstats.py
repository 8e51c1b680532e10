"""CPU seconds and peak resident memory of a process, from /proc (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcUsage:
    cpu_s: float
    peak_rss_mib: float

    def minus(self, before: ProcUsage) -> ProcUsage:
        """CPU used since `before`; the peak is a high-water mark and stays as read now."""
        return ProcUsage(self.cpu_s - before.cpu_s, self.peak_rss_mib)


def usage(pid: int) -> ProcUsage:
    """User+system CPU seconds and VmHWM (peak RSS) of `pid`; zeros if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ProcUsage(0.0, 0.0)
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    hwm_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return ProcUsage(ticks / os.sysconf("SC_CLK_TCK"), hwm_kib / 1024)
