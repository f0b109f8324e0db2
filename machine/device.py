"""Devices and precision: pick cuda/mps/cpu, pick the autocast dtype, measure peak FLOP/s."""

from __future__ import annotations

import contextlib
import functools
import time

import torch

from cli.program import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """'auto' is cuda if present, then mps, then cpu. An unavailable device is an error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"device={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={name!r} but CUDA is not available on this machine; use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"device={name!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device={name!r} but MPS is not available on this machine; use auto or cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"device={name!r} is not supported; use auto, cpu, cuda or mps")
    return device


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with native bf16 matmuls (AMX or AVX512-BF16), where autocast pays."""
    try:
        return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    except AttributeError:
        return False


def resolve_dtype(name: str, device: torch.device, training: bool) -> torch.dtype:
    """The dtype for 'auto', 'float32', 'bfloat16' or 'float16' on this device.

    'auto' is bfloat16 where the hardware runs it fast (GPUs that have it; for training,
    CPUs with AMX or AVX512-BF16), float16 for training on older GPUs (with a gradient
    scaler), else float32: decoding one token at a time on a CPU gains nothing from bf16."""
    if name == "auto":
        if device.type == "cuda":
            if torch.cuda.is_bf16_supported():
                return torch.bfloat16
            return torch.float16 if training else torch.float32
        if device.type == "cpu" and training and cpu_has_fast_bf16():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise UserError(f"dtype={name!r}: must be one of auto, {', '.join(DTYPES)}")
    if name == "float16" and device.type == "cpu":
        raise UserError("dtype=float16 is for GPUs; on the CPU use bfloat16 or float32")
    return DTYPES[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision: matmuls in dtype, weights and reductions in float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def measure_peak_flops(device: torch.device, dtype: torch.dtype, size: int = 2048, seconds: float = 0.3) -> float:
    """Matmul FLOP/s of this machine in this dtype, measured (used as the MFU denominator)."""
    g = torch.Generator(device=device).manual_seed(0)  # leave the global RNG (dropout) alone
    a = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm up
    sync()
    runs, start = 0, time.perf_counter()
    while runs == 0 or time.perf_counter() - start < seconds:
        for _ in range(4):
            a @ b
        sync()
        runs += 4
    return 2 * size**3 * runs / (time.perf_counter() - start)


@functools.cache
def peak_flops(device: torch.device, dtype: torch.dtype, threads: int) -> float:
    """The MFU denominator, measured once per process for each device, dtype and thread
    count. On a CPU a 1024² product runs as fast as a 2048² one in an eighth of the time;
    a GPU needs large matrices to reach its peak."""
    return measure_peak_flops(device, dtype, size=8192 if device.type == "cuda" else 1024)
