"""What machine a measurement ran on: CPU model and the ISA flags that decide OpenVINO's and llama.cpp's kernels.

Every result file (bench, test timings) carries this, because the machines differ between runs (AVX2-only EPYC,
AVX-512 EPYC, AMX Xeon) and a number means nothing without its CPU.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The flags that change which CPU kernels run (int8/int4 dot products, bf16, AMX tiles).
ISA_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_int8", "amx_bf16")


def cpuinfo_field(text: str, name: str) -> str:
    """The first ``name : value`` line's value in /proc/cpuinfo text ('' when absent)."""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.split(":", 1)[0].strip() == name), "")


def isa(flags: str) -> list[str]:
    """The ISA_FLAGS present in a cpuinfo flags line, in ISA_FLAGS order."""
    have = set(flags.split())
    return [f for f in ISA_FLAGS if f in have]


def generation(cpuinfo: str) -> str:
    """x86's CPU family and model numbers: a virtual machine's model name may be only "AMD EPYC" for every
    generation, and the family tells them apart ('' where cpuinfo has no such fields)."""
    family, model = cpuinfo_field(cpuinfo, "cpu family"), cpuinfo_field(cpuinfo, "model")
    return f"family {family}, model {model}" if family and model else ""


def describe(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    text = cpuinfo.read_text() if cpuinfo.is_file() else ""
    return {"cpu": cpuinfo_field(text, "model name") or platform.processor(), "generation": generation(text),
            "isa": isa(cpuinfo_field(text, "flags")), "cpus": len(os.sched_getaffinity(0)),
            "loadavg": " ".join(f"{x:.1f}" for x in os.getloadavg())}  # how quiet the machine was
