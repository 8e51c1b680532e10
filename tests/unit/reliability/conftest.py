"""The bad-input tests reuse the controller's and the node's unit harnesses (ctl_helpers,
shared_helpers, shim_helpers, sim_node), which live beside their own tests."""

from __future__ import annotations

import sys
from pathlib import Path

_UNIT = Path(__file__).resolve().parents[1]
for _sub in ("controller", "controller/shim", "kubeletplugin"):
    _path = str(_UNIT / _sub)
    if _path not in sys.path:
        sys.path.insert(0, _path)
