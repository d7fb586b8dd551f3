#!/usr/bin/env python3
"""Draw public/img/models.png: eight bars, one per server model, on a gradient.

Standard library only (zlib + struct), so the suite ships an image without an
image library and a student can see that a PNG is just a few chunks of
compressed rows. Run from the repo root: tools/make-image.py [output.png]
"""
import struct
import sys
import zlib

WIDTH, HEIGHT = 200, 100
BAR_COUNT = 8  # one bar per concurrency model, 01 .. 08
BAR_WIDTH = 16
GAP = (WIDTH - BAR_COUNT * BAR_WIDTH) // (BAR_COUNT + 1)
BASELINE = HEIGHT - 12  # leaves room for the digit under each bar
TOP = (0x1f, 0x3a, 0x5f)  # gradient colours, top to bottom (RGB)
BOTTOM = (0x0b, 0x13, 0x22)
BAR = (0xf2, 0xa5, 0x41)
DIGIT = (0xe8, 0xee, 0xf5)

# 3x5 bitmaps of the digits 1-8, one string per row, '#' = lit pixel.
DIGITS = {
    1: [".#.", "##.", ".#.", ".#.", "###"],
    2: ["##.", "..#", ".#.", "#..", "###"],
    3: ["##.", "..#", ".#.", "..#", "##."],
    4: ["#.#", "#.#", "###", "..#", "..#"],
    5: ["###", "#..", "##.", "..#", "##."],
    6: [".##", "#..", "###", "#.#", "###"],
    7: ["###", "..#", ".#.", ".#.", ".#."],
    8: ["###", "#.#", "###", "#.#", "###"],
}


def blend(a, b, t):
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))


def draw():
    """Return the picture as a list of rows, each a list of (r, g, b)."""
    rows = [[blend(TOP, BOTTOM, y / (HEIGHT - 1))] * WIDTH for y in range(HEIGHT)]
    for i in range(BAR_COUNT):
        x0 = GAP + i * (BAR_WIDTH + GAP)
        height = 20 + i * 8  # rising bars: the suite goes from 1 client to many
        for y in range(BASELINE - height, BASELINE):
            for x in range(x0, x0 + BAR_WIDTH):
                rows[y][x] = BAR
        glyph = DIGITS[i + 1]
        gx = x0 + (BAR_WIDTH - 3) // 2
        for dy, line in enumerate(glyph):
            for dx, ch in enumerate(line):
                if ch == "#":
                    rows[BASELINE + 3 + dy][gx + dx] = DIGIT
    return rows


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def encode_png(rows):
    """8-bit RGB, no interlace; each row starts with filter byte 0 (none)."""
    height, width = len(rows), len(rows[0])
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "public/img/models.png"
    with open(out, "wb") as f:
        f.write(encode_png(draw()))


if __name__ == "__main__":
    main()
