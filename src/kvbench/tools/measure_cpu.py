"""``python -m kvbench.tools.measure_cpu``: this machine's CPU as a ``hardware=`` catalog entry.

The roofline (``executor=roofline``) prices an iteration by a device's peak compute and memory
bandwidth. A GPU's come from its data sheet; a CPU's are measured here, with torch on the threads
kvbench's executor uses (``executor.num_threads``): an fp32 matmul's rate (``peak_tflops``), a
large buffer's sum (``hbm_bandwidth_gb_per_s``, read) and copy (``pcie_gb_per_s``: the swap copy,
RAM to RAM on a CPU; read + write), medians of ``--repeats``: how ``conf/hardware/cpu.yaml``'s
figures were measured, on the machine it names. The figures are a first guess at a CPU's time;
``task=profile`` measures the real one (docs/sim_to_real.md).

``--output-dir DIR`` writes ``DIR/hardware/NAME.yaml``, which a run takes with
``python -m kvbench hydra.searchpath=[file://DIR] hardware=NAME``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from kvbench.core.packaged_conf import read_option
from kvbench.tasks.profile.profile_file import device_name
from kvbench.tools import count_at_least
from kvbench.tools.steadiness import timed_runs

MATMUL_SIZE = 2048  # a square fp32 matmul large enough to run at the BLAS's full rate
BUFFER_MIB = 256  # far larger than any CPU's cache: the sum and the copy stream from RAM


def median_s(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``call`` over ``repeats`` runs, after one that warms it up."""
    return statistics.median(timed_runs(call, repeats))


def matmul_tflops(size: int, repeats: int) -> float:
    """TFLOP/s of a ``size`` x ``size`` fp32 matmul: 2 size^3 FLOPs over its median time."""
    left, right = torch.randn(size, size), torch.randn(size, size)  # each [size, size]
    return 2 * size**3 / median_s(lambda: torch.mm(left, right), repeats) / 1e12


def read_gb_per_s(num_bytes: int, repeats: int) -> float:
    """GB/s of summing an fp32 buffer of ``num_bytes``: bytes read over its median time."""
    buffer = torch.ones(num_bytes // 4)  # [num_bytes / 4]
    return num_bytes / median_s(buffer.sum, repeats) / 1e9


def copy_gb_per_s(num_bytes: int, repeats: int) -> float:
    """GB/s of copying an fp32 buffer of ``num_bytes`` into another: bytes read and written."""
    source, target = torch.ones(num_bytes // 4), torch.empty(num_bytes // 4)  # [num_bytes / 4]
    return 2 * num_bytes / median_s(lambda: target.copy_(source), repeats) / 1e9


def memory_gib() -> float:
    """The machine's RAM in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def hardware_yaml(name: str, figures: dict[str, float], cpu: str, command: str) -> str:
    """A ``conf/hardware`` entry: ``hardware=cpu``'s, with the measured figures in place of its
    own and what they were measured on."""
    import yaml

    today = datetime.date.today()
    torch_version, num_threads = torch.__version__.split("+")[0], torch.get_num_threads()
    # Three significant figures: the runs' spread makes more noise.
    matmul, read, copy = (float(f"{figures[key]:.3g}")
                          for key in ("peak_tflops", "read_gb_per_s", "copy_gb_per_s"))  # fmt: skip
    entry = {**read_option("hardware", "cpu"), "name": name,
             "memory_gib": round(figures["memory_gib"], 1), "hbm_bandwidth_gb_per_s": read,
             "peak_tflops": matmul, "pcie_gb_per_s": copy}  # fmt: skip
    return f"""# {cpu} ({os.cpu_count()} CPUs seen). Measured on {today} with torch
# {torch_version} on {num_threads} threads (medians) by `{command}`:
# an fp32 matmul {matmul} TFLOP/s, a large buffer's sum {read} GB/s read, its copy {copy} GB/s
# (read + write). "PCIe" is the swap copy, RAM to RAM here. The other settings are
# hardware=cpu's (conf/hardware/cpu.yaml). The roofline on these figures is only a first guess: a
# CPU's real time is what task=profile measures (executor=profiled).
{yaml.safe_dump(entry, sort_keys=False)}"""


def measure(matmul_size: int, buffer_bytes: int, repeats: int) -> dict[str, float]:
    """The figures ``hardware_yaml`` writes, measured on this machine now."""
    return {"peak_tflops": matmul_tflops(matmul_size, repeats),
            "read_gb_per_s": read_gb_per_s(buffer_bytes, repeats),
            "copy_gb_per_s": copy_gb_per_s(buffer_bytes, repeats),
            "memory_gib": memory_gib()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="cpu", help="the entry's name (hardware=NAME)")
    parser.add_argument("--threads", type=count_at_least(1), default=2,
                        help="torch threads (2: the profile's)")
    parser.add_argument("--repeats", type=count_at_least(1), default=7)
    parser.add_argument("--matmul-size", type=count_at_least(1), default=MATMUL_SIZE)
    parser.add_argument("--buffer-mib", type=count_at_least(1), default=BUFFER_MIB)
    parser.add_argument("--output-dir", type=Path, help="write OUTPUT_DIR/hardware/NAME.yaml")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.name):
        parser.error(f"--name {args.name!r}: expected a plain entry name (letters, digits, "
                     "'.', '_', '-'), as hardware=NAME takes it")
    if args.output_dir is not None:  # before minutes of measuring, not after
        try:
            (args.output_dir / "hardware").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            parser.error(f"--output-dir {args.output_dir}: {error.strerror or error}")
    torch.set_num_threads(args.threads)
    figures = measure(args.matmul_size, args.buffer_mib << 20, args.repeats)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m kvbench.tools.measure_cpu", *given])
    text = hardware_yaml(args.name, figures, device_name(), command)
    if args.output_dir is None:
        print(text, end="")
        return 0
    path = args.output_dir / "hardware" / f"{args.name}.yaml"
    path.write_text(text)
    print(f"{path}: use it with python -m kvbench hydra.searchpath=[file://"
          f"{args.output_dir.resolve()}] hardware={args.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
