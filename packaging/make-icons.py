#!/usr/bin/env python3
"""Draws the dsv4-chat icon: assets/icons/dsv4-chat.svg and dsv4-chat-<N>.png for the usual sizes.

Standard library only (PNG written with zlib), so nothing has to be installed and the output is the same on
every machine. The shapes are described once, in a 256-unit square, and both the SVG and the rasteriser
read that description, so the two cannot drift apart. The outputs are committed; rerun this script after
changing the drawing:  python3 packaging/make-icons.py
"""

import struct
import sys
import zlib
from pathlib import Path

SIZES = (16, 32, 48, 64, 128, 256)
SAMPLES = 4  # supersampling per axis: smooth edges without a real anti-aliasing rasteriser

TOP = (0x31, 0x82, 0xCE)  # background gradient, top
BOTTOM = (0x1A, 0x36, 0x5D)  # background gradient, bottom
WHITE = (0xFF, 0xFF, 0xFF)
DOT = (0x2B, 0x6C, 0xB0)

# (kind, geometry, colour) in painting order; colour None = the background gradient.
SHAPES = [
    ("rrect", (16, 16, 240, 240, 52), None),
    ("rrect", (48, 60, 208, 168, 40), WHITE),  # speech bubble
    ("tri", ((78, 150), (126, 150), (66, 210)), WHITE),  # its tail
    ("circle", (88, 114, 14), DOT),
    ("circle", (128, 114, 14), DOT),
    ("circle", (168, 114, 14), DOT),
]


def inside(kind, g, x, y):
    if kind == "rrect":
        x0, y0, x1, y1, r = g
        # Distance from the inner rectangle shrunk by r: inside when it is within r.
        dx = max(x0 + r - x, 0, x - (x1 - r))
        dy = max(y0 + r - y, 0, y - (y1 - r))
        return x0 <= x <= x1 and y0 <= y <= y1 and dx * dx + dy * dy <= r * r
    if kind == "circle":
        cx, cy, r = g
        return (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    if kind == "tri":
        (ax, ay), (bx, by), (cx, cy) = g
        d1 = (x - bx) * (ay - by) - (ax - bx) * (y - by)
        d2 = (x - cx) * (by - cy) - (bx - cx) * (y - cy)
        d3 = (x - ax) * (cy - ay) - (cx - ax) * (y - ay)
        neg = d1 < 0 or d2 < 0 or d3 < 0
        pos = d1 > 0 or d2 > 0 or d3 > 0
        return not (neg and pos)
    raise ValueError(kind)


def gradient(y):
    t = min(max((y - 16) / 224, 0.0), 1.0)
    return tuple(a + (b - a) * t for a, b in zip(TOP, BOTTOM))


def render(size):
    """RGBA rows (bytes), premultiplied averaging of SAMPLES x SAMPLES points per pixel."""
    scale = 256 / size
    n = SAMPLES * SAMPLES
    rows = []
    for py in range(size):
        row = bytearray()
        for px in range(size):
            acc = [0.0, 0.0, 0.0, 0.0]
            for sy in range(SAMPLES):
                y = (py + (sy + 0.5) / SAMPLES) * scale
                for sx in range(SAMPLES):
                    x = (px + (sx + 0.5) / SAMPLES) * scale
                    colour = None
                    for kind, g, c in SHAPES:
                        if inside(kind, g, x, y):
                            colour = c if c is not None else gradient(y)
                    if colour is not None:
                        acc[0] += colour[0]
                        acc[1] += colour[1]
                        acc[2] += colour[2]
                        acc[3] += 1
            cover = acc[3]
            if cover == 0:
                row += b"\0\0\0\0"
            else:
                row += bytes(round(acc[i] / cover) for i in range(3))
                row.append(round(255 * cover / n))
        rows.append(bytes(row))
    return rows


def png(size, rows):
    def chunk(tag, data):
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\0" + r for r in rows)  # filter type 0 on every row
    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def hexc(c):
    return "#%02x%02x%02x" % c


def svg():
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="256" height="256" viewBox="0 0 256 256">',
        '  <defs><linearGradient id="bg" x1="0" y1="16" x2="0" y2="240" gradientUnits="userSpaceOnUse">',
        f'    <stop offset="0" stop-color="{hexc(TOP)}"/><stop offset="1" stop-color="{hexc(BOTTOM)}"/>',
        "  </linearGradient></defs>",
    ]
    for kind, g, c in SHAPES:
        fill = "url(#bg)" if c is None else hexc(c)
        if kind == "rrect":
            x0, y0, x1, y1, r = g
            parts.append(
                f'  <rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" rx="{r}" fill="{fill}" stroke="none"/>'
            )
        elif kind == "circle":
            cx, cy, r = g
            parts.append(f'  <circle cx="{cx}" cy="{cy}" r="{r}" fill="{fill}" stroke="none"/>')
        elif kind == "tri":
            pts = " ".join(f"{x},{y}" for x, y in g)
            parts.append(f'  <polygon points="{pts}" fill="{fill}" stroke="none"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "assets/icons"
    out.mkdir(parents=True, exist_ok=True)
    (out / "dsv4-chat.svg").write_text(svg())
    for size in SIZES:
        (out / f"dsv4-chat-{size}.png").write_bytes(png(size, render(size)))
    print(f"icons written to {out}")


if __name__ == "__main__":
    main()
