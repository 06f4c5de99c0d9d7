"""Tiny server-side SVG charts for the dashboard: no JavaScript, no external assets.

    bar_chart(title, labels, series)   vertical bars over a time axis; one or more series side by side
    hbar_chart(title, items)           horizontal bars for categories (states, reason codes)

Each returns inline `<svg role="img">` markup (safe to put in a template) with a `<title>` for the
chart and one for every bar ("received 14:00: 3"), so a screen reader, a tooltip and a test can read
the numbers. Every text is escaped.
"""

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

COLOURS = ("#417690", "#79aec8", "#ba2121", "#9a6700")
FONT = 'font-family="sans-serif" font-size="10"'


def _svg(title: str, width: int, height: int, body: list[str]) -> SafeString:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
        f'<text x="4" y="14" {FONT} font-size="12" font-weight="bold">{escape(title)}</text>'
    )
    return mark_safe(head + "".join(body) + "</svg>")  # noqa: S308  (every text above is escaped)


def bar_chart(
    title: str,
    labels: list[str],
    series: list[tuple[str, list[int]]],
    *,
    width: int = 720,
    height: int = 220,
    label_every: int = 1,
) -> SafeString:
    """Bars per label, one per series side by side; y axis from 0 to the maximum; a legend at the top."""
    left, right, top, bottom = 36, 8, 30, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max([v for _, values in series for v in values] + [0])
    scale = plot_h / peak if peak else 0
    slot = plot_w / max(len(labels), 1)
    bar_w = max(slot * 0.8 / max(len(series), 1), 1)
    body = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#666"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#666"/>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" {FONT}>0</text>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {FONT}>{peak}</text>',
    ]
    for s, (name, _) in enumerate(series):
        x = left + 8 + s * 110
        body.append(
            f'<rect x="{x}" y="{top - 12}" width="10" height="10" fill="{COLOURS[s % len(COLOURS)]}"/>'
            f'<text x="{x + 14}" y="{top - 3}" {FONT}>{escape(name)}</text>'
        )
    for i, label in enumerate(labels):
        x0 = left + i * slot + slot * 0.1
        for s, (name, values) in enumerate(series):
            value = values[i]
            h = value * scale
            body.append(
                f'<rect class="bar" x="{x0 + s * bar_w:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}" fill="{COLOURS[s % len(COLOURS)]}" data-value="{value}">'
                f"<title>{escape(name)} {escape(label)}: {value}</title></rect>"
            )
        if i % label_every == 0:
            body.append(
                f'<text x="{left + (i + 0.5) * slot:.1f}" y="{top + plot_h + 14}" text-anchor="middle" '
                f"{FONT}>{escape(label)}</text>"
            )
    return _svg(title, width, height, body)


def hbar_chart(title: str, items: list[tuple[str, int]], *, width: int = 480, row: int = 18) -> SafeString:
    """One horizontal bar per (label, value), the value written after the bar; 'nothing' when empty."""
    label_w, top = 170, 24
    plot_w = width - label_w - 40
    height = top + row * max(len(items), 1) + 6
    peak = max([v for _, v in items] + [0])
    body = []
    if not items:
        body.append(f'<text x="4" y="{top + 12}" {FONT} fill="#666">nothing</text>')
    for i, (label, value) in enumerate(items):
        y = top + i * row
        w = value * plot_w / peak if peak else 0
        body.append(
            f'<text x="{label_w - 4}" y="{y + row - 6}" text-anchor="end" {FONT}>{escape(label)}</text>'
            f'<rect class="bar" x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" '
            f'fill="{COLOURS[0]}" data-value="{value}"><title>{escape(label)}: {value}</title></rect>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + row - 6}" {FONT}>{value}</text>'
        )
    return _svg(title, width, height, body)
