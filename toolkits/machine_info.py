"""What a result was measured on: the CPU, the kernels PyTorch chose, and the library versions.

The same demo, seed and code end in different places on CPUs with other vector widths (AVX2 or AVX-512
kernels sum in another order) and with other library releases, so every figure goes out with these.

    python -m toolkits.machine_info [--out machine.json]

Prints one line; ``--out`` also writes the whole record as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "ray", "vllm")
"""The releases whose kernels or defaults have moved the demo's numbers, or could."""


def cpu_flags(cpuinfo: str) -> tuple[str, list[str]]:
    """(model name, the vector extensions among its flags: avx2 and the avx512 family) from /proc/cpuinfo text."""
    model, flags = "unknown", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, sorted(f for f in flags if f == "avx2" or f.startswith("avx512"))


def machine_info() -> dict:
    """The record: CPU, cores, the kernel set PyTorch uses here, and the installed releases."""
    import torch

    try:
        model, vector = cpu_flags(Path("/proc/cpuinfo").read_text(errors="ignore"))
    except OSError:
        model, vector = platform.processor() or "unknown", []
    releases = {}
    for name in PACKAGES:
        try:
            releases[name] = version(name)
        except PackageNotFoundError:
            releases[name] = None
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512": any(f.startswith("avx512") for f in vector),
        "vector_flags": vector,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "releases": releases,
    }


def summary(info: dict) -> str:
    """One line for a log."""
    releases = ", ".join(f"{k} {v}" for k, v in info["releases"].items() if v)
    return (f"{info['cpu']}, {info['cores']} cores, {'AVX-512' if info['avx512'] else 'no AVX-512'}; torch kernels: "
            f"{info['torch_cpu_capability']}; {releases}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the record as JSON here")
    args = parser.parse_args(argv)
    info = machine_info()
    info["summary"] = summary(info)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(info, indent=1))
    print(summary(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
