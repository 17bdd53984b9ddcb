"""Small inline-SVG charts for the HTML report: line charts, stacked bars and a heat map.

Pure: values in, an ``<svg>`` string out. No JavaScript and nothing fetched: the report is one file
a person can open offline or attach to a ticket. Hover text uses SVG ``<title>`` elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
BLUE, ORANGE, GREEN, VERMILLION = "#0072B2", "#E69F00", "#009E73", "#D55E00"
SKY, PURPLE, YELLOW, GREY = "#56B4E9", "#CC79A7", "#F0E442", "#999999"

Fmt = Callable[[float], str]


@dataclass
class Series:
    label: str
    color: str
    points: list[tuple[float, float | None]]  # (x, y); y None = a gap in the line
    dashed: bool = False


@dataclass
class Stack:
    label: str
    color: str
    values: list[float | None]  # one per bar; None = this part is absent for that bar


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (about n of them)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * mag
        if (hi - lo) / step <= n:
            break
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    v = start
    while v < hi + step * 0.999:
        ticks.append(round(v, 12))
        v += step
    return ticks


def _num(v: float) -> str:
    return f"{v:.1f}"


class _Frame:
    """Maps data coordinates to pixels inside a plot area with margins for axes and a legend."""

    def __init__(self, width: int, height: int, x: tuple[float, float], y: tuple[float, float],
                 left: int = 64, right: int = 16, top: int = 30, bottom: int = 38) -> None:
        self.width, self.height = width, height
        self.left, self.top = left, top
        self.pw, self.ph = width - left - right, height - top - bottom
        self.x0, self.x1 = x if x[1] > x[0] else (x[0] - 0.5, x[0] + 0.5)
        self.y0, self.y1 = y if y[1] > y[0] else (y[0] - 0.5, y[0] + 0.5)

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.pw

    def py(self, y: float) -> float:
        return self.top + self.ph - (y - self.y0) / (self.y1 - self.y0) * self.ph

    def axes(self, xticks: Sequence[float], yticks: Sequence[float], xfmt: Fmt, yfmt: Fmt,
             xlabel: str, ylabel: str) -> list[str]:
        out = [f'<rect x="{self.left}" y="{self.top}" width="{self.pw}" height="{self.ph}" '
               'fill="none" stroke="#ccc"/>']
        for t in yticks:
            y = self.py(t)
            out.append(f'<line x1="{self.left}" x2="{self.left + self.pw}" y1="{_num(y)}" y2="{_num(y)}" '
                       'stroke="#eee"/>')
            out.append(f'<text x="{self.left - 6}" y="{_num(y + 4)}" text-anchor="end" class="tick">'
                       f'{escape(yfmt(t))}</text>')
        base = self.top + self.ph
        for t in xticks:
            x = self.px(t)
            out.append(f'<line x1="{_num(x)}" x2="{_num(x)}" y1="{base}" y2="{base + 4}" stroke="#888"/>')
            out.append(f'<text x="{_num(x)}" y="{base + 16}" text-anchor="middle" class="tick">'
                       f'{escape(xfmt(t))}</text>')
        out.append(f'<text x="{self.left + self.pw / 2:.1f}" y="{self.height - 4}" text-anchor="middle" '
                   f'class="axis">{escape(xlabel)}</text>')
        out.append(f'<text x="12" y="{self.top + self.ph / 2:.1f}" text-anchor="middle" class="axis" '
                   f'transform="rotate(-90 12 {self.top + self.ph / 2:.1f})">{escape(ylabel)}</text>')
        return out


def _off_scale(x: float, y: float, color: str, text: str) -> str:
    """A ▲ on the top edge for a value above the axis; hovering shows it."""
    return (f'<path d="M{_num(x - 5)},{_num(y + 8)} L{_num(x + 5)},{_num(y + 8)} L{_num(x)},{_num(y)} Z" '
            f'fill="{color}" stroke="#333" stroke-width="0.6"><title>{escape(text)}</title></path>')


def _off_scale_note(fr: _Frame, items: Sequence[str]) -> str:
    """One line, right-aligned above the plot, listing the values drawn as ▲ (up to four)."""
    if not items:
        return ""
    more = f" and {len(items) - 4} more" if len(items) > 4 else ""
    return (f'<text x="{fr.left + fr.pw}" y="14" text-anchor="end" class="note">▲ above the axis: '
            f'{escape("; ".join(items[:4]) + more)}</text>')


def _legend(items: Sequence[tuple[str, str, bool]], x: float, y: float = 14) -> list[str]:
    out = []
    for label, color, dashed in items:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(f'<line x1="{_num(x)}" x2="{_num(x + 18)}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" '
                   f'stroke-width="3"{dash}/>')
        out.append(f'<text x="{_num(x + 22)}" y="{y}" class="legend">{escape(label)}</text>')
        x += 34 + 7.0 * len(label)
    return out


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
            f'role="img" aria-label="{escape(title)}" class="chart">\n<title>{escape(title)}</title>\n'
            + "\n".join(body) + "\n</svg>")


def _int_ticks(x0: float, x1: float, n: int = 10) -> list[float]:
    return [t for t in nice_ticks(x0, x1, n) if x0 <= t <= x1 and float(t).is_integer()] or [x0]


def line_chart(series: Sequence[Series], *, title: str, xlabel: str, ylabel: str, yfmt: Fmt,
               band: tuple[float, float, str] | None = None, hlines: Sequence[tuple[float, str]] = (),
               width: int = 920, height: int = 260, y_from_zero: bool = True,
               y_max: float | None = None, marks: Sequence[tuple[float, float, str]] = ()) -> str:
    """Lines over x (iterations). ``band`` shades an x range (e.g. steady state) with a label;
    ``marks`` shade further x ranges in red with a hover text (e.g. incidents);
    ``hlines`` draws labelled reference lines (drawn only when inside the value range); values above
    ``y_max`` (e.g. warm-up outliers) sit on the top edge as ▲ markers that show their value."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points if y is not None]
    if not xs or not ys:
        return _svg(width, 60, ['<text x="10" y="30" class="note">no values to plot</text>'], title)
    lo = 0.0 if y_from_zero and min(ys) >= 0 else min(ys)
    hi = min(max(ys), y_max) if y_max is not None and y_max > lo else max(ys)
    ticks = nice_ticks(lo, hi * (1.08 if hi > 0 else 1.0) if hi != lo else lo + 1)
    top = ticks[-1]
    fr = _Frame(width, height, (min(xs), max(xs)), (ticks[0], ticks[-1]))
    body = []
    if band is not None:
        bx0, bx1 = fr.px(max(band[0], fr.x0)), fr.px(min(band[1], fr.x1))
        body.append(f'<rect x="{_num(bx0)}" y="{fr.top}" width="{_num(max(bx1 - bx0, 1))}" height="{fr.ph}" '
                    f'fill="#eef6ee"><title>{escape(band[2])}</title></rect>')
    for m0, m1, text in marks:
        mx0, mx1 = fr.px(max(m0, fr.x0)), fr.px(min(m1, fr.x1))
        if mx1 > mx0 or m0 <= fr.x1:
            body.append(f'<rect class="incident" x="{_num(mx0)}" y="{fr.top}" '
                        f'width="{_num(max(mx1 - mx0, 2))}" height="{fr.ph}" fill="#f8d7d7" opacity="0.7">'
                        f'<title>{escape(text)}</title></rect>')
    body += fr.axes(_int_ticks(fr.x0, fr.x1), ticks, lambda v: f"{v:g}", yfmt, xlabel, ylabel)
    if band is not None:
        body.append(f'<text x="{_num(fr.px(max(band[0], fr.x0)) + 4)}" y="{fr.top + 12}" '
                    f'class="note">{escape(band[2])}</text>')
    for value, label in hlines:
        if ticks[0] <= value <= ticks[-1]:
            hy = fr.py(value)
            body.append(f'<line x1="{fr.left}" x2="{fr.left + fr.pw}" y1="{_num(hy)}" y2="{_num(hy)}" '
                        f'stroke="{GREY}" stroke-dasharray="2 3"/>')
            body.append(f'<text x="{fr.left + fr.pw - 4}" y="{_num(hy - 3)}" text-anchor="end" '
                        f'class="note">{escape(label)}</text>')
    off: list[str] = []
    for s in series:
        runs: list[list[tuple[float, float]]] = [[]]
        for x, yv in s.points:
            if yv is None:
                runs.append([])
            else:
                runs[-1].append((fr.px(x), fr.py(min(yv, top))))
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        for run in runs:
            if len(run) > 1:
                pts = " ".join(f"{_num(px)},{_num(py)}" for px, py in run)
                body.append(f'<polyline points="{pts}" fill="none" stroke="{s.color}" '
                            f'stroke-width="2"{dash}/>')
        if len(s.points) <= 400:
            for x, yv in s.points:
                if yv is not None and yv <= top:
                    body.append(f'<circle cx="{_num(fr.px(x))}" cy="{_num(fr.py(yv))}" r="2.6" '
                                f'fill="{s.color}"><title>{escape(s.label)} @ {x:g}: '
                                f'{escape(yfmt(yv))}</title></circle>')
        above = [(x, yv) for x, yv in s.points if yv is not None and yv > top]
        body += [_off_scale(fr.px(x), fr.top, s.color, f"{s.label} @ {x:g}: {yfmt(yv)}") for x, yv in above]
        off += [f"{x:g}: {yfmt(yv)}" for x, yv in above]
    body += _legend([(s.label, s.color, s.dashed) for s in series], fr.left)
    body.append(_off_scale_note(fr, off))
    return _svg(width, height, body, title)


def stacked_bars(xs: Sequence[str], stacks: Sequence[Stack], *, title: str, xlabel: str, ylabel: str,
                 yfmt: Fmt, width: int = 920, height: int = 280, y_max: float | None = None) -> str:
    """One bar per x, its parts stacked bottom-up in the order given; absent parts are left out.
    Bars taller than ``y_max`` are cut at the top edge and marked ▲ with their total."""
    totals = [sum(v for s in stacks if (v := s.values[i]) is not None) for i in range(len(xs))]
    if not xs or max(totals, default=0) <= 0:
        return _svg(width, 60, ['<text x="10" y="30" class="note">no values to plot</text>'], title)
    hi = min(max(totals), y_max) if y_max is not None and y_max > 0 else max(totals)
    ticks = nice_ticks(0, hi * 1.05)
    top = ticks[-1]
    fr = _Frame(width, height, (0, len(xs)), (0, top))
    step = max(1, math.ceil(len(xs) / 12))
    body = fr.axes([], ticks, str, yfmt, xlabel, ylabel)
    bw = fr.pw / len(xs)
    base_y = fr.top + fr.ph
    off: list[str] = []
    for i, x in enumerate(xs):
        acc = 0.0
        left = fr.left + i * bw + bw * 0.1
        for s in stacks:
            v = s.values[i]
            if v is None or v <= 0 or acc >= top:
                acc += v or 0.0
                continue
            y_top, y_bot = fr.py(min(acc + v, top)), fr.py(acc)
            body.append(f'<rect x="{_num(left)}" y="{_num(y_top)}" width="{_num(max(bw * 0.8, 0.5))}" '
                        f'height="{_num(max(y_bot - y_top, 0.0))}" fill="{s.color}">'
                        f'<title>{escape(xlabel)} {escape(x)}: {escape(s.label)} '
                        f'{escape(yfmt(v))}</title></rect>')
            acc += v
        if totals[i] > top:
            body.append(_off_scale(left + bw * 0.4, fr.top, GREY, f"{xlabel} {x}: total {yfmt(totals[i])}"))
            off.append(f"{x}: {yfmt(totals[i])}")
        if i % step == 0:
            cx = fr.left + (i + 0.5) * bw
            body.append(f'<text x="{_num(cx)}" y="{base_y + 16}" text-anchor="middle" class="tick">'
                        f'{escape(x)}</text>')
    body += _legend([(s.label, s.color, False) for s in stacks], fr.left)
    body.append(_off_scale_note(fr, off))
    return _svg(width, height, body, title)


def diverging_color(v: float, center: float, spread: float) -> str:
    """Blue below ``center``, white at it, red above; saturated at ``center ± spread``."""
    t = max(-1.0, min(1.0, (v - center) / spread)) if spread > 0 else 0.0
    lo, hi, mid = (33, 102, 172), (178, 24, 43), (247, 247, 247)
    end = hi if t > 0 else lo
    a = abs(t)
    r, g, b = (round(mid[k] + (end[k] - mid[k]) * a) for k in range(3))
    return f"#{r:02x}{g:02x}{b:02x}"


@dataclass
class ColumnMark:
    """A range of a heat map's columns marked above it (an incident, a capture): first and last
    column index, colour, and the hover text."""

    first: int
    last: int
    color: str
    text: str


def heatmap(rows: Sequence[str], cols: Sequence[str], values: Sequence[Sequence[float | None]], *,
            title: str, xlabel: str, ylabel: str, center: float = 1.0, spread: float = 0.2,
            vfmt: Fmt = lambda v: f"{v:.3f}", width: int = 920,
            groups: Sequence[tuple[int, str]] = (), marks: Sequence[ColumnMark] = ()) -> str:
    """rows × cols cells coloured by value (diverging around ``center``), with a colour bar.
    ``groups``: (first row, label) where a group of rows begins (a line and its label on the right);
    ``marks``: column ranges drawn as bars above the cells and outlined over them."""
    if not rows or not cols:
        return _svg(width, 60, ['<text x="10" y="30" class="note">no values to plot</text>'], title)
    cell_h = max(2.0, min(36.0, 360.0 / len(rows)))
    left, right = 96, 120
    top = 30 + (14 if marks else 0)
    height = int(top + cell_h * len(rows) + 40)
    pw = width - left - right
    cw = pw / len(cols)
    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{cell_h * len(rows):.1f}" fill="#eee"/>']
    for r, row in enumerate(values):
        y = top + r * cell_h
        for c, v in enumerate(row):
            if v is None:
                continue
            body.append(f'<rect x="{_num(left + c * cw)}" y="{_num(y)}" width="{_num(cw + 0.3)}" '
                        f'height="{_num(cell_h + 0.3)}" fill="{diverging_color(v, center, spread)}">'
                        f'<title>{escape(ylabel)} {escape(rows[r])}, {escape(xlabel)} {escape(cols[c])}: '
                        f'{escape(vfmt(v))}</title></rect>')
    label_every = max(1, math.ceil(len(rows) * 12 / (cell_h * len(rows))))
    for r in range(0, len(rows), label_every):
        body.append(f'<text x="{left - 6}" y="{_num(top + (r + 0.5) * cell_h + 4)}" text-anchor="end" '
                    f'class="tick">{escape(rows[r])}</text>')
    col_every = max(1, math.ceil(len(cols) / 12))
    base = top + cell_h * len(rows)
    for c in range(0, len(cols), col_every):
        body.append(f'<text x="{_num(left + (c + 0.5) * cw)}" y="{_num(base + 16)}" text-anchor="middle" '
                    f'class="tick">{escape(cols[c])}</text>')
    body.append(f'<text x="{left + pw / 2:.1f}" y="{height - 4}" text-anchor="middle" class="axis">'
                f'{escape(xlabel)}</text>')
    body.append(f'<text x="14" y="{top - 10}" class="axis">{escape(ylabel)}</text>')
    grid_h = cell_h * len(rows)
    for first, label in groups:
        y = top + first * cell_h
        if first:
            body.append(f'<line x1="{left - 90}" y1="{_num(y)}" x2="{left + pw}" y2="{_num(y)}" '
                        'stroke="#222" stroke-width="1.5"/>')
        body.append(f'<text x="{left + pw + 4}" y="{_num(y + 11)}" class="tick">{escape(label)}</text>')
    for m in marks:
        x0, w = left + m.first * cw, (m.last - m.first + 1) * cw
        body.append(f'<rect x="{_num(x0)}" y="{top - 12}" width="{_num(max(w, 2.0))}" height="9" '
                    f'fill="{m.color}"><title>{escape(m.text)}</title></rect>')
        body.append(f'<rect x="{_num(x0)}" y="{top}" width="{_num(max(w, 2.0))}" height="{_num(grid_h)}" '
                    f'fill="none" stroke="{m.color}" stroke-width="2" stroke-dasharray="4 2">'
                    f'<title>{escape(m.text)}</title></rect>')
    # colour bar
    bx, bh = width - right + 60, min(cell_h * len(rows), 200.0)
    n = 20
    for i in range(n):
        v = center + spread - 2 * spread * (i + 0.5) / n
        body.append(f'<rect x="{bx}" y="{_num(top + i * bh / n)}" width="14" height="{_num(bh / n + 0.5)}" '
                    f'fill="{diverging_color(v, center, spread)}"/>')
    for v, yy in ((center + spread, top), (center, top + bh / 2), (center - spread, top + bh)):
        body.append(f'<text x="{bx + 20}" y="{_num(yy + 4)}" class="tick">{escape(vfmt(v))}</text>')
    return _svg(width, height, body, title)
