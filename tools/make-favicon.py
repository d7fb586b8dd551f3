#!/usr/bin/env python3
"""Draw public/favicon.ico: the logo's rising bars at 16x16 and 32x32.

An ICO file is a small directory (one 16-byte entry per image) followed by
the images; since Windows Vista each image may simply be a PNG, which every
browser reads. The PNGs come from tools/make-image.py's encoder, so this
stays standard library only. Run from the repo root:
tools/make-favicon.py [output.ico]
"""
import importlib.util
import struct
import sys
from pathlib import Path

SIZES = (16, 32)
BACK = (0x1f, 0x3a, 0x5f)  # the logo's colours
BAR = (0xf2, 0xa5, 0x41)
BARS = 4  # fewer bars than the logo: eight do not fit in 16 pixels


def load_encoder():
    path = Path(__file__).with_name("make-image.py")
    spec = importlib.util.spec_from_file_location("make_image", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.encode_png


def draw(size):
    """Rising bars on the logo's blue, scaled to size x size."""
    rows = [[BACK] * size for _ in range(size)]
    unit = size // 16  # 1 pixel at 16, 2 at 32
    for i in range(BARS):
        x0 = (1 + i * 4) * unit
        height = (4 + i * 3) * unit
        for y in range(size - unit - height, size - unit):
            for x in range(x0, x0 + 3 * unit):
                rows[y][x] = BAR
    return rows


def encode_ico(pngs):
    """ICONDIR, one ICONDIRENTRY per image, then the images in order."""
    head = struct.pack("<HHH", 0, 1, len(pngs))  # reserved, type 1 = icon
    offset = len(head) + 16 * len(pngs)
    entries, images = b"", b""
    for size, png in pngs:
        entries += struct.pack("<BBBBHHII", size % 256, size % 256, 0, 0, 1,
                               32, len(png), offset + len(images))
        images += png
    return head + entries + images


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "public/favicon.ico"
    encode_png = load_encoder()
    pngs = [(size, encode_png(draw(size))) for size in SIZES]
    with open(out, "wb") as f:
        f.write(encode_ico(pngs))


if __name__ == "__main__":
    main()
