"""Hand-written SVG charts (no plotting library: the lab is standard-library Python).

Two kinds of panel cover every scenario: a line chart (TPS or latency against clients or pool
size, optionally on a log axis) and a grouped bar chart (one group per workload or client
count, one bar per target).  A Figure lays panels out side by side under a title, so one file
shows throughput and latency together.  Colours are fixed per target name, so sluice is the
same colour in every plot.  `to_png` converts with rsvg-convert when it is installed.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
COLORS = {
    "direct": "#6b7280",
    "sluice": "#0f766e",
    "pgbouncer": "#d97706",
    "pgpool": "#7c3aed",
    "haproxy": "#b91c1c",
}
CYCLE = ["#2563eb", "#dc2626", "#059669", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"]

PANEL_W, PANEL_H = 500, 340
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 20, 64, 52


def color_for(name: str, index: int) -> str:
    key = name.lower().split()[0] if name else ""
    for k, c in COLORS.items():
        if key.startswith(k):
            return c
    return CYCLE[index % len(CYCLE)]


def compact(v: float) -> str:
    """Axis/label number: 12,345 -> '12.3k', 0.25 -> '0.25'."""
    if v is None:
        return ""
    a = abs(v)
    if a >= 1_000_000:
        return f"{v / 1e6:.3g}M"
    if a >= 10_000:
        return f"{v / 1e3:.3g}k"
    if a >= 100 or float(v).is_integer():
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while not ticks or ticks[-1] < hi - 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


@dataclass
class Series:
    name: str
    points: list[tuple[float, float | None]]
    color: str | None = None
    dashed: bool = False


@dataclass
class LinePanel:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    log_x: bool = False
    y_floor_zero: bool = True
    marks: list[tuple[float, str]] = field(default_factory=list)  # vertical marker lines
    x_ticks: list[float] | None = None  # labelled x values (default: every x of the data)
    dots: bool = True                   # a circle on each point (off for long time series)
    y_top: float | None = None          # the y axis reaches at least this (e.g. all clients)


@dataclass
class BarPanel:
    title: str
    y_label: str
    groups: list[str]
    series: list[str]
    values: dict[tuple[str, str], float | None]
    notes: dict[tuple[str, str], str] = field(default_factory=dict)  # small red text over a bar
    colors: dict[str, str] = field(default_factory=dict)


@dataclass
class Figure:
    name: str            # file stem
    title: str
    subtitle: str = ""
    panels: list = field(default_factory=list)
    columns: int = 2

    def svg(self) -> str:
        cols = max(1, min(self.columns, len(self.panels)))
        rows = math.ceil(len(self.panels) / cols)
        head = 58 if self.subtitle else 40
        width = cols * PANEL_W + 20
        height = head + rows * PANEL_H + 10
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'viewBox="0 0 {width} {height}" font-family="{FONT}">',
               f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
               _text(14, 26, self.title, size=17, weight="bold")]
        if self.subtitle:
            out.append(_text(14, 46, self.subtitle, size=12, fill="#4b5563"))
        for i, panel in enumerate(self.panels):
            x0 = 10 + (i % cols) * PANEL_W
            y0 = head + (i // cols) * PANEL_H
            out.append(f'<g transform="translate({x0},{y0})">')
            if isinstance(panel, LinePanel):
                out.extend(_line_panel(panel))
            else:
                out.extend(_bar_panel(panel))
            out.append("</g>")
        out.append("</svg>")
        return "\n".join(out) + "\n"

    def save(self, directory: Path) -> list[Path]:
        path = directory / f"{self.name}.svg"
        path.write_text(self.svg())
        written = [path]
        png = to_png(path)
        if png:
            written.append(png)
        return written


def to_png(svg_path: Path) -> Path | None:
    tool = shutil.which("rsvg-convert")
    if not tool:
        return None
    png = svg_path.with_suffix(".png")
    try:
        subprocess.run([tool, "-f", "png", "-o", str(png), str(svg_path)], check=True,
                       capture_output=True, timeout=60)
        return png
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------------------ drawing

def _text(x, y, s, size=12, anchor="start", fill="#111827", weight="normal", rotate=None):
    rot = f' transform="rotate({rotate},{x:.1f},{y:.1f})"' if rotate is not None else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}" font-weight="{weight}"{rot}>{escape(str(s))}</text>')


def _frame(title, y_label, x_label, legend):
    """Panel title, legend row, axis labels; returns (svg parts, plot box)."""
    left, top = MARGIN_L, MARGIN_T
    w = PANEL_W - MARGIN_L - MARGIN_R
    h = PANEL_H - MARGIN_T - MARGIN_B
    parts = [_text(left, 18, title, size=13, weight="bold")]
    # legend: one row (wrapping) under the title
    lx, ly = left, 38
    for name, color, dashed in legend:
        item_w = 26 + 7 * len(name)
        if lx + item_w > PANEL_W - 10:
            lx, ly = left, ly + 15
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        parts.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 16}" y2="{ly - 4}" '
                     f'stroke="{color}" stroke-width="3"{dash}/>')
        parts.append(_text(lx + 20, ly, name, size=11, fill="#374151"))
        lx += item_w
    parts.append(_text(14, top + h / 2, y_label, size=11, anchor="middle", fill="#374151",
                       rotate=-90))
    if x_label:
        parts.append(_text(left + w / 2, PANEL_H - 12, x_label, size=11, anchor="middle",
                           fill="#374151"))
    return parts, (left, top, w, h)


def tick_label(t: float, top_tick: float) -> str:
    """Same style for every tick of an axis: all in thousands once the axis reaches 10k."""
    if top_tick >= 10_000:
        return f"{t / 1000:g}k" if t else "0"
    return compact(t)


def _y_axis(parts, box, ticks, y_of):
    left, top, w, h = box
    for t in ticks:
        y = y_of(t)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" '
                     f'stroke="#e5e7eb" stroke-width="1"/>')
        parts.append(_text(left - 6, y + 4, tick_label(t, ticks[-1]), size=10, anchor="end",
                           fill="#4b5563"))
    parts.append(f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" '
                 f'stroke="#9ca3af" stroke-width="1"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" '
                 f'stroke="#9ca3af" stroke-width="1"/>')


def _line_panel(p: LinePanel) -> list[str]:
    legend = [(s.name, s.color or color_for(s.name, i), s.dashed) for i, s in enumerate(p.series)]
    parts, box = _frame(p.title, p.y_label, p.x_label, legend)
    left, top, w, h = box
    xs = sorted({x for s in p.series for x, y in s.points if y is not None})
    ys = [y for s in p.series for _, y in s.points if y is not None]
    if not xs or not ys:
        parts.append(_text(left + w / 2, top + h / 2, "no data", anchor="middle", fill="#9ca3af"))
        return parts
    labelled = xs
    if p.x_ticks:
        labelled = sorted(p.x_ticks)
        xs = sorted(set(xs) | {labelled[0], labelled[-1]})
    lo_y = 0.0 if p.y_floor_zero else min(ys)
    hi_y = max(max(ys), p.y_top or 0)
    ticks = nice_ticks(lo_y, hi_y * 1.05 if hi_y > 0 else 1)
    y_lo, y_hi = ticks[0], ticks[-1]

    def fx(x):
        if p.log_x:
            a, b = math.log(max(xs[0], 1e-9)), math.log(max(xs[-1], 1e-9))
            v = math.log(max(x, 1e-9))
        else:
            a, b, v = xs[0], xs[-1], x
        if b == a:
            return left + w / 2
        return left + 12 + (v - a) / (b - a) * (w - 24)

    def fy(y):
        return top + h - (y - y_lo) / (y_hi - y_lo) * h
    _y_axis(parts, box, ticks, fy)
    for x in labelled:
        parts.append(f'<line x1="{fx(x):.1f}" y1="{top + h}" x2="{fx(x):.1f}" y2="{top + h + 4}" '
                     f'stroke="#9ca3af"/>')
        parts.append(_text(fx(x), top + h + 17, compact(x), size=10, anchor="middle",
                           fill="#4b5563"))
    for x, label in p.marks:
        parts.append(f'<line x1="{fx(x):.1f}" y1="{top}" x2="{fx(x):.1f}" y2="{top + h}" '
                     f'stroke="#dc2626" stroke-width="1" stroke-dasharray="4,3"/>')
        near_right = fx(x) + 6 * len(label) > left + w
        parts.append(_text(fx(x) - 4 if near_right else fx(x) + 4, top + 12, label, size=10,
                           anchor="end" if near_right else "start", fill="#dc2626"))
    for i, s in enumerate(p.series):
        color = s.color or color_for(s.name, i)
        pts = [(fx(x), fy(y)) for x, y in sorted(s.points) if y is not None]
        if not pts:
            continue
        dash = ' stroke-dasharray="6,4"' if s.dashed else ""
        d = " ".join(f"{'M' if j == 0 else 'L'}{x:.1f},{y:.1f}" for j, (x, y) in enumerate(pts))
        parts.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2.5"{dash}/>')
        for x, y in (pts if p.dots else ()):
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#ffffff" '
                         f'stroke="{color}" stroke-width="2"/>')
    return parts


def _bar_panel(p: BarPanel) -> list[str]:
    legend = [(s, p.colors.get(s) or color_for(s, i), False) for i, s in enumerate(p.series)]
    parts, box = _frame(p.title, p.y_label, "", legend)
    left, top, w, h = box
    vals = [v for v in p.values.values() if v is not None]
    ticks = nice_ticks(0, max(vals) * 1.12 if vals and max(vals) > 0 else 1)
    y_hi = ticks[-1]

    def fy(y):
        return top + h - y / y_hi * h
    _y_axis(parts, box, ticks, fy)
    n_g, n_s = len(p.groups), max(1, len(p.series))
    group_w = w / max(1, n_g)
    bar_w = min(42.0, group_w * 0.8 / n_s)
    for gi, g in enumerate(p.groups):
        gx = left + gi * group_w + (group_w - bar_w * n_s) / 2
        for si, s in enumerate(p.series):
            x = gx + si * bar_w
            color = legend[si][1]
            v = p.values.get((g, s))
            note = p.notes.get((g, s))
            if v is None:
                if note:  # e.g. "not installed"; a bar that was never meant to run stays blank
                    parts.append(_text(x + bar_w / 2, top + h - 4, note, size=9,
                                       anchor="start", fill="#9ca3af", rotate=-90))
                continue
            y = fy(v)
            parts.append(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" '
                         f'height="{top + h - y:.1f}" fill="{color}" rx="1.5"/>')
            label_size = 10 if bar_w >= 30 else 9
            parts.append(_text(x + bar_w / 2, y - 4, compact(v), size=label_size,
                               anchor="middle", fill="#111827"))
            if note:
                inside = top + h - y > 70
                ny = y + 14 if inside else y - 16
                parts.append(_text(x + bar_w / 2, ny, note, size=9, anchor="end" if inside
                                   else "start", fill="#ffffff" if inside else "#dc2626",
                                   rotate=-90, weight="bold"))
        for li, line in enumerate(g.split("\n")[:2]):  # up to two lines per group label
            if len(line) * 6.5 > group_w:
                line = line[: max(3, int(group_w / 6.5) - 1)] + "…"
            parts.append(_text(left + gi * group_w + group_w / 2, top + h + 16 + 13 * li, line,
                               size=11, anchor="middle", fill="#374151"))
    return parts
