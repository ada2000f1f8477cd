"""GPU specifications, detection of the present GPU, and the CPU-only mode.

The table holds datasheet figures (dense tensor-core rates, without sparsity).
They are the ceilings the roofline lab draws and, with the margin each GPU's
clocks allow (``hbm_margin``, ``fp16_margin``), the floor the timing module
uses to reject impossible measurements. A GPU missing from the table is
graded against the row of its track (``sm_90a`` or ``sm_100a``) and the report
says which row was used.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

TRACKS = ("sm_90a", "sm_100a")


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    name: str
    track: str              # "sm_90a" (Hopper) or "sm_100a" (Blackwell)
    sm_count: int
    fp16_tflops: float      # dense fp16/bf16 tensor-core peak, TFLOP/s
    fp32_tflops: float      # non-tensor fp32 peak, TFLOP/s
    hbm_tbps: float         # HBM bandwidth, TB/s (1e12 bytes per second)
    smem_per_block_kib: int # largest dynamic shared memory per block, KiB
    l2_mib: int             # L2 cache size, MiB
    # How far the GPU's own clocks put its ceilings above the datasheet figures: the floor that
    # rejects impossible times (timing.physical_floor) sits at figure x margin. 1.0 where the
    # clocks have not been read on that GPU.
    hbm_margin: float = 1.0     # bus width x memory clock (NVML) over hbm_tbps
    fp16_margin: float = 1.0    # highest SM clock over the clock fp16_tflops is quoted at

    @property
    def peak_flops(self) -> float:
        """Dense fp16 peak in FLOP/s."""
        return self.fp16_tflops * 1e12

    @property
    def bandwidth(self) -> float:
        """HBM bandwidth in bytes/s."""
        return self.hbm_tbps * 1e12

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the fp16 roofline bends."""
        return self.peak_flops / self.bandwidth


# Hopper's margins. fp16: 989 TFLOP/s is 132 SMs x 4096 dense fp16 FLOP per SM and clock at
# 1830 MHz; the SM clock goes up to 1980 MHz (NVML's sm_clock_max_mhz in every report of
# reports/h200/). HBM: the H200's 6144-bit bus at NVML's memory clock of 3201 MHz, two transfers
# per clock, moves 4.92 TB/s, 2.4% above the datasheet's 4.8 (a rounded pin rate). The best
# rates the H200 reports record are 4.25 TB/s and 768 TFLOP/s, well below either ceiling.
HOPPER_FP16_MARGIN = 1980 / 1830
H200_HBM_MARGIN = 2 * 3201e6 * 6144 / 8 / 4.8e12

SPECS: dict[str, GPUSpec] = {
    "B200": GPUSpec("B200", "sm_100a", sm_count=148, fp16_tflops=2250.0, fp32_tflops=75.0,
                    hbm_tbps=8.0, smem_per_block_kib=227, l2_mib=126),
    "H200": GPUSpec("H200", "sm_90a", sm_count=132, fp16_tflops=989.0, fp32_tflops=67.0,
                    hbm_tbps=4.8, smem_per_block_kib=227, l2_mib=50,
                    hbm_margin=H200_HBM_MARGIN, fp16_margin=HOPPER_FP16_MARGIN),
    # Before "H100": the NVL card's name also holds the word H100; its HBM3 is faster than the SXM's.
    "H100 NVL": GPUSpec("H100 NVL", "sm_90a", sm_count=132, fp16_tflops=835.0, fp32_tflops=60.0,
                        hbm_tbps=3.9, smem_per_block_kib=227, l2_mib=50, fp16_margin=HOPPER_FP16_MARGIN),
    "H100": GPUSpec("H100", "sm_90a", sm_count=132, fp16_tflops=989.0, fp32_tflops=67.0,
                    hbm_tbps=3.35, smem_per_block_kib=227, l2_mib=50, fp16_margin=HOPPER_FP16_MARGIN),
}

# The row used for a GPU of a track that has no row of its own.
TRACK_DEFAULT = {"sm_90a": "H200", "sm_100a": "B200"}


@dataclasses.dataclass(frozen=True)
class Device:
    """What the grader runs on: a GPU (name as the driver reports it) or the CPU."""
    present: bool
    driver_name: str          # e.g. "NVIDIA H200", or "" without a GPU
    spec: GPUSpec | None      # the table row used
    row_note: str             # how the row was chosen, for the report
    reason: str = ""          # why there is no GPU, when present is False
    uuid: str = ""            # the GPU's UUID (names its grading lock), "" without a GPU
    sm_count: int = 0         # streaming multiprocessors, as the driver reports them (0 without a GPU)

    @property
    def track(self) -> str | None:
        return self.spec.track if self.spec else None


def spec_for_name(driver_name: str, capability: tuple[int, int] | None = None) -> tuple[GPUSpec | None, str]:
    """Match a driver name ("NVIDIA H200", "NVIDIA B200") to a row of SPECS.

    Falls back to the track's row when the name is unknown but the compute
    capability says Hopper (9.x) or Blackwell (10.x).
    """
    upper = driver_name.upper()
    for key, spec in SPECS.items():
        if key in upper.replace("-", " ").split() or f" {key}" in f" {upper}":
            return spec, f"row {key} (exact match for {driver_name!r})"
    track = None
    if capability is not None:
        track = {9: "sm_90a", 10: "sm_100a"}.get(capability[0])
    if track is None:
        return None, f"no row for {driver_name!r} (compute capability {capability}); not a course GPU"
    row = TRACK_DEFAULT[track]
    return SPECS[row], f"row {row} (fallback for {driver_name!r}, track {track})"


def detect() -> Device:
    """Return the present GPU, or a CPU-only Device explaining why there is none.

    ``GRADER_CPU_ONLY=1`` forces the CPU-only mode even where a GPU exists.
    """
    if os.environ.get("GRADER_CPU_ONLY") == "1":
        return Device(False, "", None, "", reason="GRADER_CPU_ONLY=1 is set")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return Device(False, "", None, "", reason="torch is not installed")
    if not torch.cuda.is_available():
        why = "no CUDA GPU visible to torch"
        if torch.version.cuda is None:
            why += " (this torch is a CPU-only build)"
        return Device(False, "", None, "", reason=why)
    name = torch.cuda.get_device_name(0)
    cap = torch.cuda.get_device_capability(0)
    spec, note = spec_for_name(name, cap)
    if spec is None:
        return Device(False, name, None, note, reason=note)
    props = torch.cuda.get_device_properties(0)
    try:
        uuid = str(props.uuid)
    except (AttributeError, RuntimeError):
        uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
    return Device(True, name, spec, note, uuid=uuid, sm_count=int(props.multi_processor_count))


def has_gpu() -> bool:
    return detect().present


def nvidia_smi_available() -> bool:
    return shutil.which("nvidia-smi") is not None


def driver_version() -> str:
    if not nvidia_smi_available():
        return ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""
