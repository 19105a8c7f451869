"""Nominal rates of a device kind this machine does not have, for `dtcli plan HF_DIR --auto
--devices gpu:8` on a laptop: the cost model (autoplan.cost) priced by a data sheet instead of a
probe, and the kind's memory as the budget where --memory gives none. The output says so.

NVIDIA H100 SXM5 80GB (NVIDIA's data sheet, dense, without sparsity): 494.7 TFLOP/s TF32 (what
float32 matmuls run as: TensorFlow enables TF32 on Ampere and later), 989.4 TFLOP/s BF16, HBM3 at
3.35 TB/s, NVLink 4 at 900 GB/s both directions together (450 GB/s each way, what a ring
all-reduce moves per device). The per-collective latency (10 us, NCCL within one node) and the
seconds per op (5 us: a kernel launch) are round guesses, not data
sheet figures: they rank candidates, they do not predict a step to the millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtcli.autoplan.cost import Calibration, Rates


@dataclass(frozen=True)
class Nominal:
    name: str
    flops_float32: float  # FLOP/s per device of float32 matmuls (TF32)
    flops_bf16: float  # FLOP/s per device of bfloat16 matmuls
    memory: int  # bytes per device
    memory_rate: float  # bytes/s per device
    link_rate: float  # bytes/s per device, each way
    collective_seconds: float  # per collective (latency)
    op_seconds: float  # per op

    def flops(self, precision: str) -> float:
        return self.flops_bf16 if precision == "bf16" else self.flops_float32

    def calibration(self, count: int, precision: str) -> Calibration:
        """The same rates for a mesh of every divisor of `count` and for XLA on one device."""
        groups = [g for g in range(2, count + 1) if count % g == 0]
        rates = Rates(
            self.flops(precision),
            {g: self.collective_seconds for g in groups},
            {g: self.link_rate for g in groups},
            self.op_seconds,
            self.memory_rate,
        )
        meshes = {n: rates for n in range(1, count + 1) if count % n == 0}
        return Calibration(meshes, rates)

    def text(self, precision: str) -> str:
        kind = "BF16" if precision == "bf16" else "TF32 (float32 matmuls)"
        return (
            f"{self.name}: {self.flops(precision) / 1e12:,.1f} TFLOP/s {kind} dense, "
            f"{self.memory / 2**30:,.0f} GiB at {self.memory_rate / 1e12:.2f} TB/s, "
            f"{self.link_rate / 1e9:,.0f} GB/s per device each way, "
            f"{self.collective_seconds * 1e6:,.0f} us per collective and "
            f"{self.op_seconds * 1e6:,.0f} us per op (guesses)"
        )


# By DTensor's device type. Only GPUs: a TPU's count and kind are known on the TPU VM alone.
NOMINAL = {
    "GPU": Nominal(
        "nominal NVIDIA H100 SXM 80GB",
        494.7e12,
        989.4e12,
        80 * 2**30,
        3.35e12,
        450e9,
        10e-6,
        5e-6,
    ),
}
