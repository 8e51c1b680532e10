"""`flexmig simulate --report DIR`: one self-contained HTML page (inline SVG, no script, no network).

Built from the `--json` document (export.py), which is written beside it as `simulate.json`:
acceptance and memory in use over time, refusals per request size, and every GPU's slice map when
the last pod arrived, one map per policy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#7f7f7f", "#9467bd", "#8c564b"]
PROFILE_COLORS = {"1g": "#9ecae1", "2g": "#6baed6", "3g": "#4292c6", "4g": "#2171b5", "7g": "#084594"}
W, H, PAD = 640, 260, 44


def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _legend(names: Sequence[str]) -> str:
    items = [
        f'<span class="key"><i style="background:{_color(i)}"></i>{escape(n)}</span>'
        for i, n in enumerate(names)
    ]
    return f'<div class="legend">{"".join(items)}</div>'


def _line_chart(title: str, results: Sequence[dict[str, Any]], column: int) -> str:
    """One line per policy over time; y is a share (0..100 %)."""
    end = max((p[0] for r in results for p in r["timeline"]), default=1.0) or 1.0
    parts = [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img"><title>{escape(title)}</title>']
    for pct in (0, 25, 50, 75, 100):
        y = H - PAD - (H - 2 * PAD) * pct / 100
        parts.append(f'<line x1="{PAD}" x2="{W - 10}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{PAD - 6}" y="{y + 4:.1f}" text-anchor="end">{pct} %</text>')
    parts.append(
        f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">time (arrivals of the pod stream)</text>'
    )
    for i, r in enumerate(results):
        pts = " ".join(
            f"{PAD + (W - PAD - 10) * p[0] / end:.1f},{H - PAD - (H - 2 * PAD) * p[column]:.1f}"
            for p in r["timeline"]
        )
        dash = ' stroke-dasharray="6 4"' if not r["realized"] else ""
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{_color(i)}" stroke-width="2"{dash}/>')
    parts.append("</svg>")
    return f"<h3>{escape(title)}</h3>{_legend([r['policy'] for r in results])}{''.join(parts)}"


def _refusal_chart(results: Sequence[dict[str, Any]]) -> str:
    """Grouped bars: per request size, the share of those pods each policy refused."""
    sizes = [s["memory_mib"] for s in results[0]["refused_by_size"]] if results else []
    group = (W - PAD - 10) / max(1, len(sizes))
    bar = group * 0.8 / max(1, len(results))
    parts = [
        f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img"><title>refusals per size</title>'
    ]
    for pct in (0, 25, 50, 75, 100):
        y = H - PAD - (H - 2 * PAD) * pct / 100
        parts.append(f'<line x1="{PAD}" x2="{W - 10}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{PAD - 6}" y="{y + 4:.1f}" text-anchor="end">{pct} %</text>')
    for si, size in enumerate(sizes):
        x0 = PAD + si * group + group * 0.1
        label = f"{size / 1024:.1f} GiB"
        parts.append(
            f'<text x="{x0 + group * 0.4:.1f}" y="{H - PAD + 16}" text-anchor="middle">{label}</text>'
        )
        for ri, r in enumerate(results):
            row = r["refused_by_size"][si]
            share = row["refused"] / row["asked"] if row["asked"] else 0.0
            h = (H - 2 * PAD) * share
            parts.append(
                f'<rect x="{x0 + ri * bar:.1f}" y="{H - PAD - h:.1f}" width="{bar * 0.9:.1f}" height="{h:.1f}" '
                f'fill="{_color(ri)}"><title>{escape(r["policy"])}: {row["refused"]} of {row["asked"]}</title></rect>'
            )
    parts.append(f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">memory the pod asked for</text></svg>')
    title = "Refused pods per request size (share of the pods of that size)"
    return f"<h3>{title}</h3>{_legend([r['policy'] for r in results])}{''.join(parts)}"


def _slice_maps(result: dict[str, Any]) -> str:
    """One bar per GPU, memory slices left to right, each instance a labelled block."""
    gpus = result["final_slice_map"]
    if not gpus:
        return ""
    width, row_h, label_w = 720, 26, 230
    per_slice = (width - label_w - 10) / max(g["memory_slices"] for g in gpus)
    height = row_h * len(gpus) + 6
    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    parts.append(f"<title>{escape(result['policy'])} slice map</title>")
    for gi, g in enumerate(gpus):
        y = 3 + gi * row_h
        parts.append(f'<text x="0" y="{y + 16}">{escape(g["gpu"])} {escape(g["model"])}</text>')
        parts.append(
            f'<rect x="{label_w}" y="{y}" width="{per_slice * g["memory_slices"]:.1f}" height="{row_h - 6}" '
            'class="free"/>'
        )
        for inst in g["instances"]:
            x = label_w + per_slice * inst["start"]
            color = PROFILE_COLORS.get(inst["profile"].split(".")[0], "#6baed6")
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{per_slice * inst["size"]:.1f}" height="{row_h - 6}" '
                f'fill="{color}" stroke="#fff"><title>{escape(inst["profile"])}@{inst["start"]}</title></rect>'
            )
            parts.append(f'<text x="{x + 3:.1f}" y="{y + 14}" class="inst">{escape(inst["profile"])}</text>')
    parts.append("</svg>")
    busy = sum(i["size"] for g in gpus for i in g["instances"])
    total = sum(g["memory_slices"] for g in gpus)
    return (
        f"<h3>{escape(result['policy'])}: {busy} of {total} memory slices in use when the last pod arrived</h3>"
        + "".join(parts)
    )


def _summary_table(results: Sequence[dict[str, Any]]) -> str:
    head = "<tr><th>policy</th><th>pods placed</th><th>accept %</th><th>memory accept %</th>"
    head += "<th>points below bound (pods / memory)</th><th>GPU instances created / leaked</th></tr>"
    rows = []
    for r in results:
        below = r["below_bound"]
        gap = f"{below['pods']:.1f} / {below['memory']:.1f}" if below else "-"
        gis = f"{r['gi_created']} / {r['gi_leaked']}" if r["realized"] else "- (not realised)"
        rows.append(
            f"<tr><td>{escape(r['policy'])}</td><td>{r['accepted']} of {r['pods']}</td>"
            f"<td>{100 * r['acceptance']:.1f}</td><td>{100 * r['memory_acceptance']:.1f}</td>"
            f"<td>{gap}</td><td>{gis}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


STYLE = """
body{font-family:sans-serif;margin:24px;max-width:1000px;color:#222}
pre{background:#f6f6f6;padding:10px;white-space:pre-wrap}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
svg text{font-size:11px;fill:#333}svg text.inst{fill:#fff;font-size:10px}
.grid{stroke:#e3e3e3}.free{fill:#f0f0f0;stroke:#bbb}
.legend{margin:4px 0}.key{margin-right:14px}.key i{display:inline-block;width:12px;height:12px;margin-right:4px}
"""


def render(document: dict[str, Any], summary_text: str) -> str:
    results = document["results"]
    body = [
        "<h1>flexmig simulate</h1>",
        f"<pre>{escape(summary_text)}</pre>",
        _summary_table(results),
        _line_chart("Pods accepted so far (share of pods that arrived)", results, 1),
        _line_chart("GPU memory in use (share of all MIG memory)", results, 2),
        "<p>The bound (dashed) may move running slices, which no real cluster does; its memory in use is"
        " approximated by the smallest slice that serves each request.</p>",
        _refusal_chart(results),
        "<h2>Each GPU's slices when the last pod arrived</h2>",
        "<p>Grey: free memory slices. A block: one MIG instance (profile, e.g. 3g.20gb = 3 compute and"
        " 20 GB), placed at its start slice.</p>",
        *[_slice_maps(r) for r in results],
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>flexmig simulate report</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write(directory: Path, document: dict[str, Any], summary_text: str) -> list[Path]:
    """Write index.html and simulate.json into `directory` (created if missing); return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    page = directory / "index.html"
    page.write_text(render(document, summary_text), encoding="utf-8")
    data = directory / "simulate.json"
    data.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return [page, data]
