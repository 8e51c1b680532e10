"""`--idle-grace-period` and `--idle-reuse-across-namespaces`: whether MIG GPU instances outlive their
claim for reuse (kubeletplugin/prepare/idle.py). Off by default: unprepare then destroys everything,
as it always did."""

from __future__ import annotations

from dataclasses import dataclass

from kubeletplugin.settings.flags import ConfigError, Flag

MAX_IDLE_GRACE_S = 3600.0  # an idle GI holds slices the allocator may count as free: keep it short


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    grace_s: float = 0.0  # 0: nothing is kept (the default)
    # Reuse by a claim of another namespace. GPU memory scrubbing between tenants is not something
    # NVML promises, so this is the administrator's explicit choice (docs/kubelet-plugin.md).
    across_namespaces: bool = False

    @property
    def enabled(self) -> bool:
        return self.grace_s > 0


def idle_policy(grace: Flag, grace_raw: str, across: Flag, across_raw: str) -> IdlePolicy:
    try:
        seconds = float(grace_raw)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds <= MAX_IDLE_GRACE_S:  # NaN fails too
        raise ConfigError(
            f"{grace.label()}: {grace_raw!r}; allowed: a number of seconds in 0..{MAX_IDLE_GRACE_S:.0f}"
            " (0 = off)"
        )
    if across_raw.lower() not in ("true", "false"):
        raise ConfigError(f"{across.label()}: {across_raw!r}; allowed: true, false")
    return IdlePolicy(seconds, across_raw.lower() == "true")
