"""Draw a step trace as SVG (or an HTML page holding the SVG and the text
timeline; or PNG through Pillow, which SGLang installs). Pure Python, no
plotting dependency.

Steps run left to right. Lanes, top to bottom:

* ``ops injected``: control operations the script injected (triangle; the
  label above reads ``step: op``); ``answers``: the scheduler's answer in the
  step that processed it (green success, red refused);
* one lane per PP slot (``forward`` outside PP): the forward launched in that
  step, striped by request, with the batch mode letter (E extend, D decode);
* one lane per ``req_to_token`` row that any request held: which request
  owned it at each step (hatched once that request finished);
* ``waiting``: queue length; ``chunked``: the request parked between chunks;
* one lane per race window that opened.

Requests keep one colour everywhere. An invariant violation is a red column
with the invariant's name.
"""
from __future__ import annotations

import html
from typing import Any, Dict, List, Optional, Tuple

from scripted_runtime.timeline import format_timeline, mode_letter

LABEL_W = 150
TOP = 96
LABEL_ROWS = 3
LANE_H = 16
GAP = 10


def _color(i: int) -> str:
    hue = (i * 137.508) % 360  # golden angle: neighbours get distant hues
    return f"hsl({hue:.0f},65%,{55 if i % 2 == 0 else 42}%)"


def _plain(rid: str) -> str:
    return rid[:-1] if rid.endswith("*") else rid


def _short(rid: str, n: int = 14) -> str:
    return rid if len(rid) <= n else rid[: n - 1] + "~"


class _Svg:
    def __init__(self, width: float, height: float) -> None:
        self.width, self.height = width, height
        self.parts: List[str] = []

    def rect(self, x, y, w, h, fill, opacity=1.0):
        op = f' fill-opacity="{opacity}"' if opacity < 1 else ""
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{op}/>')

    def text(self, x, y, s, size=11, fill="#222", anchor="start", bold=False, rotate=0):
        extra = ' font-weight="bold"' if bold else ""
        if rotate:
            extra += f' transform="rotate({rotate} {x:.1f} {y:.1f})"'
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" '
                          f'text-anchor="{anchor}"{extra}>{html.escape(str(s))}</text>')

    def line(self, x1, y1, x2, y2, stroke, width=1.0, dashed=False):
        extra = ' stroke-dasharray="3,3"' if dashed else ""
        self.parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                          f'stroke="{stroke}" stroke-width="{width}"{extra}/>')

    def polygon(self, points, fill):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.parts.append(f'<polygon points="{pts}" fill="{fill}"/>')

    def finish(self) -> str:
        body = "\n".join(self.parts)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
                f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" font-family="monospace">\n{body}\n</svg>\n')


class _Png:
    """The same drawing on a Pillow image (Pillow comes with SGLang); for
    looking at a trace where no SVG viewer is at hand."""

    def __init__(self, width: float, height: float) -> None:
        try:
            from PIL import Image, ImageDraw, ImageFont
        except ImportError as exc:
            raise ValueError("PNG output needs Pillow (pip install pillow); use .svg or .html") from exc
        self._Image, self._ImageDraw, self._font = Image, ImageDraw, ImageFont
        # An RGB image drawn through an RGBA Draw blends translucent fills.
        self.img = Image.new("RGB", (int(width), int(height)), "white")
        self.draw = ImageDraw.Draw(self.img, "RGBA")
        self._fonts: Dict[int, Any] = {}

    def _rgba(self, color: str, opacity: float = 1.0):
        from PIL import ImageColor

        r, g, b = ImageColor.getrgb(color)[:3]
        return (r, g, b, int(255 * opacity))

    def _f(self, size: int):
        if size not in self._fonts:
            try:
                self._fonts[size] = self._font.load_default(size=size)
            except TypeError:  # Pillow < 10.1
                self._fonts[size] = self._font.load_default()
        return self._fonts[size]

    def rect(self, x, y, w, h, fill, opacity=1.0):
        self.draw.rectangle([x, y, x + max(w, 1) - 1, y + max(h, 1) - 1], fill=self._rgba(fill, opacity))

    def text(self, x, y, s, size=11, fill="#222", anchor="start", bold=False, rotate=0):
        anchor_code = {"start": "ls", "middle": "ms", "end": "rs"}[anchor]
        self.draw.text((x, y), str(s), fill=self._rgba(fill), font=self._f(size), anchor=anchor_code)

    def line(self, x1, y1, x2, y2, stroke, width=1.0, dashed=False):
        self.draw.line([x1, y1, x2, y2], fill=self._rgba(stroke, 0.6 if dashed else 1.0),
                       width=max(1, int(width)))

    def polygon(self, points, fill):
        self.draw.polygon(points, fill=self._rgba(fill))

    def finish(self) -> Any:
        return self.img


def select_steps(records: List[Dict[str, Any]], steps: Optional[Tuple[int, int]]) -> List[Dict[str, Any]]:
    if steps is None:
        return records
    lo, hi = steps
    return [r for r in records if lo <= r.get("step", 0) <= hi]


def render_svg(header: Dict[str, Any], records: List[Dict[str, Any]], *, title: str = "") -> str:
    return _draw(header, records, title, _Svg)


def render_png(header: Dict[str, Any], records: List[Dict[str, Any]], path: str, *, title: str = "") -> None:
    _draw(header, records, title, _Png).save(path)


def _draw(header: Dict[str, Any], records: List[Dict[str, Any]], title: str, surface_cls) -> Any:
    if not records:
        raise ValueError("no steps to draw")
    n = len(records)
    cw = max(4.0, min(18.0, 1100.0 / n))
    width = max(LABEL_W + n * cw + 160, 760.0)  # room for the subtitle and a violation label

    rid_order: Dict[str, int] = {}

    def color(rid: str) -> str:
        rid = _plain(rid)
        if rid not in rid_order:
            rid_order[rid] = len(rid_order)
        return _color(rid_order[rid])

    for rec in records:  # fix colours in order of first appearance
        for b in rec.get("launched") or []:
            for rid in b["rids"]:
                color(rid)
        for rid in (rec.get("rows") or {}):
            color(rid)

    slots = sorted({b.get("slot") for rec in records for b in rec.get("launched") or []},
                   key=lambda s: -1 if s is None else s) or [None]
    rows = sorted({row for rec in records for row in (rec.get("rows") or {}).values()})
    window_names = []
    for rec in records:
        for name in rec.get("windows") or {}:
            if name not in window_names:
                window_names.append(name)

    lanes: List[Tuple[str, str]] = [("ops", "ops injected"), ("answers", "answers")]
    lanes += [(f"slot:{s}", "forward" if s is None else f"PP slot {s}") for s in slots]
    lanes += [(f"row:{r}", f"row {r}") for r in rows]
    lanes += [("waiting", "waiting queue"), ("chunked", "chunked_req")]
    lanes += [(f"win:{w}", w) for w in window_names]
    lane_y = {key: TOP + i * LANE_H + (GAP if i > 0 else 0) for i, (key, _) in enumerate(lanes)}
    chart_bottom = TOP + len(lanes) * LANE_H + GAP
    legend_y = chart_bottom + 36
    legend_cols = max(1, int((width - 20) // 170))
    legend_rows = (len(rid_order) + legend_cols - 1) // legend_cols
    height = legend_y + legend_rows * 16 + 16

    svg = surface_cls(width, height)
    svg.rect(0, 0, width, height, "#fff")
    head = title or header.get("script", "trace")
    svg.text(10, 18, head, size=13, fill="#000", bold=True)
    svg.text(10, 36, f"{header.get('loop', '?')} loop, pp={header.get('pp_size', 1)}, "
             f"sglang {header.get('sglang_version', '?')}, steps {records[0].get('step')}.."
             f"{records[-1].get('step')}; invariants: {', '.join(header.get('invariants') or []) or 'off'}",
             size=11, fill="#444")
    for key, label in lanes:
        y = lane_y[key]
        svg.rect(0, y, width, LANE_H, "#f6f6f6" if list(lane_y).index(key) % 2 else "#fff")
        svg.text(LABEL_W - 6, y + LANE_H - 4, label, size=10, anchor="end",
                 fill="#7a4" if key.startswith("win:") else "#333")

    def x_of(i: int) -> float:
        return LABEL_W + i * cw

    tick = max(1, int(round(50 / cw)))
    label_ends = [0.0] * LABEL_ROWS  # right edge of the last op label in each label row
    for i, rec in enumerate(records):
        x = x_of(i)
        if i % tick == 0:
            svg.line(x, TOP - 2, x, chart_bottom, "#ddd", width=0.5)
            svg.text(x + 1, TOP - 4, rec.get("step"), size=9, fill="#888")
        for b in rec.get("launched") or []:
            y = lane_y[f"slot:{b.get('slot')}"]
            rids = b["rids"] or ["?"]
            h = (LANE_H - 2) / len(rids)
            for k, rid in enumerate(rids):
                svg.rect(x, y + 1 + k * h, cw - 0.5, h, color(rid))
            if cw >= 8:
                svg.text(x + cw / 2, y + LANE_H - 4, mode_letter(b.get("mode")), size=9, fill="#fff",
                         anchor="middle", bold=True)
        finished = {_plain(r) for bt in (rec.get("batches") or {}).values() for r in bt["rids"] if r.endswith("*")}
        for rid, row in (rec.get("rows") or {}).items():
            y = lane_y[f"row:{row}"]
            svg.rect(x, y + 1, cw - 0.5, LANE_H - 2, color(rid), 0.35 if rid in finished else 1.0)
        waiting = rec.get("waiting") or []
        if waiting:
            y = lane_y["waiting"]
            svg.rect(x, y + 1, cw - 0.5, LANE_H - 2, "#bbb")
            if cw >= 8:
                svg.text(x + cw / 2, y + LANE_H - 4, len(waiting), size=9, anchor="middle")
        if rec.get("chunked"):
            svg.rect(x, lane_y["chunked"] + 1, cw - 0.5, LANE_H - 2, color(rec["chunked"]))
        for name in rec.get("windows") or {}:
            svg.rect(x, lane_y[f"win:{name}"] + 2, cw - 0.5, LANE_H - 4, "#9c6", 0.8)
        for name in rec.get("entered") or []:
            if f"win:{name}" in lane_y:
                svg.text(x + cw / 2, lane_y[f"win:{name}"] + LANE_H - 4, "@", size=10, anchor="middle",
                         fill="#040", bold=True)
        y_ops = lane_y["ops"]
        for op in rec.get("ops") or []:
            svg.polygon([(x, y_ops + 2), (x + cw, y_ops + 2), (x + cw / 2, y_ops + LANE_H - 2)], "#136")
            svg.line(x + cw / 2, y_ops + LANE_H, x + cw / 2, chart_bottom, "#136", width=0.8, dashed=True)
            row = min(range(LABEL_ROWS), key=lambda k: (label_ends[k] > x, label_ends[k]))
            label = f"{rec.get('step')}: {op['op']}"
            ly = TOP - 20 - (LABEL_ROWS - 1 - row) * 11
            svg.text(x, ly, label, size=9, fill="#136")
            label_ends[row] = x + len(label) * 5.6 + 6
        y_ans = lane_y["answers"]
        for ans in rec.get("answers") or []:
            ok = ans.get("success")
            svg.rect(x, y_ans + 1, cw - 0.5, LANE_H - 2, "#2a2" if ok else ("#d00" if ok is False else "#aaa"))
            if ok is False:
                svg.text(x + cw + 2, y_ans + LANE_H - 4, f"{ans['op']} refused", size=9, fill="#d00")
        if rec.get("violation"):
            svg.rect(x, TOP, cw, chart_bottom - TOP, "#e00", 0.25)
            svg.line(x + cw / 2, TOP - 2, x + cw / 2, chart_bottom, "#e00", width=2)
            svg.text(x + cw / 2, chart_bottom + 14, f"!! {rec['violation']['invariant']} (step {rec.get('step')})",
                     size=11, anchor="middle", fill="#d00", bold=True)
    svg.text(10, legend_y - 8, "requests:", size=10, fill="#444")
    for i, (rid, idx) in enumerate(rid_order.items()):
        col, row = i % legend_cols, i // legend_cols
        lx, ly = 10 + col * 170, legend_y + row * 16
        svg.rect(lx, ly, 12, 12, _color(idx))
        svg.text(lx + 16, ly + 10, _short(rid, 24), size=10)
    return svg.finish()


def render_html(header: Dict[str, Any], records: List[Dict[str, Any]], *, title: str = "") -> str:
    svg = render_svg(header, records, title=title)
    text = html.escape(format_timeline(records, header=header))
    return (f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title or header.get('script', 'trace'))}"
            f"</title></head>\n<body style='font-family:monospace'>\n{svg}\n<pre>{text}</pre>\n</body></html>\n")
