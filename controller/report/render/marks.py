"""The quality-vs-speed chart's marks as a still picture tells them apart (a printout, a screenshot, a slide):

- `encoding`: every variant its own marker, the symbol its strategy and the colour the variant; no two
  variants share both (a strategy's eleventh variant takes its symbol open, then the next free symbol).
- `legends`: one legend per strategy, titled with it, set as columns below the panels (a table of the
  variants, each column a strategy), where one legend of 50 entries wrapped into a block of rows.
- `place_labels`: each point's variant written beside it where the label fits: clear of the other labels,
  of the other points and of the panel's edges, at the narrowest width the chart is drawn at (the printed
  page's); a point whose label would collide keeps its marker, legend entry and hover.

Pixel sizes are plotly's at the fonts set here; the chart is laid out for NOMINAL_WIDTH, and a wider
window only spreads the points further apart."""

from __future__ import annotations

import re
from collections.abc import Sequence

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
SYMBOLS = [
    "circle",
    "square",
    "diamond",
    "triangle-up",
    "cross",
    "x",
    "star",
    "pentagon",
    "hexagon",
    "triangle-down",
    "hourglass",
    "bowtie",
    "triangle-left",
    "triangle-right",
    "hexagram",
    "star-square",
    "diamond-wide",
    "square-x",
    "circle-x",
    "star-diamond",
]
MARKS = [(s + fill, c) for fill in ("", "-open") for s in SYMBOLS for c in PALETTE]  # 400 distinct marks
NOMINAL_WIDTH = 1040  # the printed page's width (report.js draws each chart at it): the narrowest drawing
PAGE_HEIGHT = 660  # the printed page's height (A4 landscape less report.css's margins, 718 px) less a heading
LEGEND_FONT = 11
ENTRY_PX = 19  # a legend entry's height at LEGEND_FONT, its symbol at a constant size
TITLE_PX = 22  # a legend's title
SWATCH_PX = 46  # a legend entry's symbol and the gap before its text
CHAR_PX = 6.6  # a character's width at LEGEND_FONT (wide enough for digits and lower case)
LABEL_FONT = 10
LABEL_CHAR_PX = 6.0
LABEL_PX = 13  # a direct label's height
MARKER_PX = 11
BELOW_AXIS_PX = 56  # from the panels' bottom edge to the legends: the speed axis's ticks and title


def encoding(strategies: Sequence[str], labels: Sequence[str]) -> dict[str, dict]:
    """variant label -> its marker, for the cells' strategies and labels: the strategies in sweep order, each
    one's variants in their legend's order (`natural`), the first ten variants ten colours, so that a
    legend's colours run in order; past MARKS' 400 marks they repeat, one per 400 variants."""
    order_of = list(dict.fromkeys(strategies))
    variants = sorted(dict.fromkeys(zip(strategies, labels)), key=lambda v: (order_of.index(v[0]), natural(v[1])))
    used: set[tuple[str, str]] = set()
    out = {}
    for i, (strategy, label) in enumerate(variants):
        home = order_of.index(strategy) % len(SYMBOLS)
        order = [
            (SYMBOLS[(home + k) % len(SYMBOLS)] + fill, PALETTE[(i + j) % len(PALETTE)])
            for k in range(len(SYMBOLS))
            for fill in ("", "-open")
            for j in range(len(PALETTE))
        ]
        symbol, color = next((m for m in order if m not in used), MARKS[i % len(MARKS)])
        used.add((symbol, color))
        out[label] = {"symbol": symbol, "color": color, "size": MARKER_PX, "line": {"width": 1.5, "color": color}}
    return out


def natural(label: str) -> list:
    """A label's sort key with its numbers as numbers: `top_k(k=2)` before `top_k(k=10)`."""
    parts = re.split(r"(\d+(?:\.\d+)?)", label)
    return [(0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)]


def text_px(text: str, char_px: float = CHAR_PX) -> float:
    return len(text) * char_px


def _legend(title: str) -> dict:
    return {
        "title": {"text": title, "font": {"size": LEGEND_FONT + 1}},
        "font": {"size": LEGEND_FONT},
        "orientation": "v",
        "itemsizing": "constant",
        "tracegroupgap": 0,
        "itemclick": "toggle",
        "xanchor": "left",
        "yanchor": "top",
    }


def _size(title: str, labels: Sequence[str]) -> tuple[float, float]:
    """A legend's width and height in px."""
    w = max(text_px(title) + 8, *(SWATCH_PX + text_px(label) for label in labels)) + 16
    return w, (TITLE_PX if title else 0) + ENTRY_PX * len(labels) + 12


def legends(
    families: dict[str, list[str]], width: float, extra: Sequence[str]
) -> tuple[dict, dict[str, tuple[str, int]], float]:
    """(layout entries `legend`, `legend2`, … each with its place `px`, (left, top) below the plot area in px;
    label -> (its legend's name, its rank there); the block's height in px) for the variants of each strategy
    (`families`, in sweep order; a legend lists them by their parameters' values), as columns packed left to
    right into rows at most `width` px wide, and `extra` entries (the Pareto front, the reference) in a legend
    of their own under the shortest column wide enough for it (else after the others)."""
    placed: list[tuple[str, list[str], float, float, float, float]] = []  # title, labels, left, top, w, h
    left = row_top = row_h = 0.0
    for title, labels in families.items():
        w, h = _size(title, labels)
        if placed and left + w > width:
            left, row_top, row_h = 0.0, row_top + row_h, 0.0
        placed.append((title, sorted(labels, key=natural), left, row_top, w, h))
        left, row_h = left + w, max(row_h, h)
    if extra:
        w, h = _size("", extra)
        under = [p for p in placed if p[3] == row_top and p[4] >= w]  # the last row's
        if under:
            col = min(under, key=lambda p: (p[3] + p[5], -p[2]))
            placed.append(("", list(extra), col[2], col[3] + col[5], w, h))
        else:
            at_left = left + w <= width
            placed.append(("", list(extra), left if at_left else 0.0, row_top if at_left else row_top + row_h, w, h))
    layout: dict[str, dict] = {}
    owner: dict[str, tuple[str, int]] = {}
    for title, labels, x, y, _, _ in placed:
        name = "legend" if not layout else f"legend{len(layout) + 1}"
        layout[name] = {**_legend(title), "px": (x, y)}
        owner.update({label: (name, rank) for rank, label in enumerate(labels)})
    return layout, owner, max(p[3] + p[5] for p in placed)


def place_legends(layout: dict, plot_w: float, plot_h: float, below: float) -> None:
    """Each legend's place (`px`, from `legends`) `below` px under the plot area, as paper coordinates."""
    for entry in layout.values():
        left, top = entry.pop("px")
        entry.update(x=left / plot_w, y=-(below + top) / plot_h)


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > 0 and min(a[3], b[3]) - max(a[1], b[1]) > 0


def _box(px: float, py: float, w: float, where: str) -> tuple[float, float, float, float]:
    gap = MARKER_PX / 2 + 3
    if where == "middle right":
        return (px + gap, py - LABEL_PX / 2, px + gap + w, py + LABEL_PX / 2)
    if where == "middle left":
        return (px - gap - w, py - LABEL_PX / 2, px - gap, py + LABEL_PX / 2)
    if where == "top center":
        return (px - w / 2, py - gap - LABEL_PX, px + w / 2, py - gap)
    return (px - w / 2, py + gap, px + w / 2, py + gap + LABEL_PX)  # bottom center


def place_labels(
    points: Sequence[tuple[float, float, str, float, float]],
    x_range: Sequence[float],
    y_range: Sequence[float],
    size: tuple[float, float],
    lines: Sequence[float] = (),
) -> list[tuple[str, str]]:
    """(text, textposition) per point (x, y, label, the low and high ends of its speed interval): the label
    beside its point where it fits in a panel of `size` px with those axis ranges, else ("", …): no label
    over another label, a point, an interval's bar, a horizontal line at a height in `lines` (the reference)
    or the panel's edge."""
    w_px, h_px = size
    sx = w_px / ((x_range[1] - x_range[0]) or 1.0)
    sy = h_px / ((y_range[1] - y_range[0]) or 1.0)
    at = [((x - x_range[0]) * sx, (y_range[1] - y) * sy) for x, y, *_ in points]
    half = MARKER_PX / 2
    blocked = [(px - half, py - half, px + half, py + half) for px, py in at]
    for (px, py), (x, _, _, lo, hi) in zip(at, points):  # the speed interval's bar and its caps
        left = px - (x - lo) * sx if lo == lo else px
        right = px + (hi - x) * sx if hi == hi else px
        blocked.append((left - 1, py - 4, right + 1, py + 4))
    blocked += [(0, (y_range[1] - y) * sy - 2, w_px, (y_range[1] - y) * sy + 2) for y in lines]
    taken: list[tuple[float, float, float, float]] = []
    out = [("", "middle right")] * len(points)
    for i in sorted(range(len(points)), key=lambda i: at[i]):
        w = text_px(points[i][2], LABEL_CHAR_PX)
        for where in ("middle right", "middle left", "top center", "bottom center"):
            box = _box(*at[i], w, where)
            inside = box[0] >= 0 and box[1] >= 0 and box[2] <= w_px and box[3] <= h_px
            if inside and not any(_overlap(box, b) for b in taken + blocked):
                taken.append(box)
                out[i] = (points[i][2], where)
                break
    return out
