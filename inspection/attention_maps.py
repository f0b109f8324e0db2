"""Attention maps: each head's T × T weights as a heatmap, for TensorBoard and PNG files.

The weights are those of the model's own trace (model.trace: the explicit five steps,
whatever attn_impl it trains with, since the fused kernel never materialises them). Row i of a map is query token i; column j is key token j; the causal triangle
above the diagonal is always dark. Brightness is √weight, so weak links stay visible.
"""

from __future__ import annotations

import math
import struct
import zlib

import torch

from model import GPT, evaluating

# a few stops of the viridis colour map (dark purple → blue → green → yellow), linearly blended;
# the attention explorer page draws with the same stops
VIRIDIS = torch.tensor([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]],
                      dtype=torch.float32) / 255


@torch.no_grad()
def attention_maps(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Attention weights of every layer for idx [1, T] in eval mode: [n_layer, H, T, T], float32."""
    with evaluating(model):
        trace = model.trace(idx)
    return trace.weights[:, 0].float().cpu()  # [n_layer, H, T, T]; images are drawn on the CPU


def heatmap_grid(maps: torch.Tensor, gap: int = 2) -> torch.Tensor:
    """maps [rows, cols, T, T] in [0, 1] -> an RGB image [height, width, 3], uint8.

    One cell per map, each scaled up (nearest pixel) to at least ~96 pixels, with a
    white gap between cells."""
    rows, cols, T, _ = maps.shape
    scale = max(1, math.ceil(96 / T))
    cell = T * scale
    values = maps.clamp(0, 1).sqrt().repeat_interleave(scale, -2).repeat_interleave(scale, -1)  # [R, C, cell, cell]
    position = values * (len(VIRIDIS) - 1)
    low = position.floor().long().clamp(max=len(VIRIDIS) - 2)
    frac = (position - low)[..., None]
    colours = VIRIDIS[low] * (1 - frac) + VIRIDIS[low + 1] * frac  # [R, C, cell, cell, 3]
    image = torch.ones(rows * (cell + gap) + gap, cols * (cell + gap) + gap, 3)
    for r in range(rows):
        for c in range(cols):
            top, left = gap + r * (cell + gap), gap + c * (cell + gap)
            image[top:top + cell, left:left + cell] = colours[r, c]
    return (image * 255).round().to(torch.uint8)


def png_bytes(image: torch.Tensor) -> bytes:
    """Encode an RGB image [height, width, 3] (uint8) as PNG: signature, IHDR, IDAT, IEND."""
    height, width, _ = image.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    # each scanline starts with filter type 0 (none)
    raw = b"".join(b"\x00" + row.tobytes() for row in image.contiguous().numpy())
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b""))
