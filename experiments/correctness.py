"""Correctness against a float64 reference, the same check for every mode and kernel."""

import math

import torch

# Relative-error budget ||out - ref|| / ||ref|| for each compute dtype, with the reason.
# bf16 keeps 8 mantissa bits (2^-9 = 2e-3 per rounding); sums of many rounded products stay
# well under 1e-2. fp16 keeps 11 bits. TF32 rounds fp32 operands to 10 bits. Plain fp32 only
# accumulates in a different order than float64.
TOLERANCES = {
    "bf16": 1.6e-2,
    "fp16": 2e-3,
    "fp32": 1e-4,
    "fp32-tf32": 5e-3,
}


# A composed computation (a block of several ops, a backward through a chain of them) rounds
# every intermediate to the dtype, so eager PyTorch itself can sit past the per-op budget there.
# A row is then held to EAGER_FACTOR times eager's own error on the same inputs, as the fuzzer
# holds single calls; for single ops eager's error is far under the budget and changes nothing.
EAGER_FACTOR = 2.0


def allowed_error(dtype_tolerance: float, eager_error: float) -> float:
    """The relative error a row may reach: the dtype's budget, or EAGER_FACTOR x eager's."""
    return max(dtype_tolerance, EAGER_FACTOR * eager_error)


def tolerance(dtype_name: str, tf32: bool) -> float:
    if dtype_name == "fp32" and tf32:
        return TOLERANCES["fp32-tf32"]
    return TOLERANCES[dtype_name]


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64; NaN or inf anywhere gives inf, so it never passes."""
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(device=out64.device, dtype=torch.float64)
    if out64.shape != ref64.shape:
        raise ValueError(f"output shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}")
    if not torch.isfinite(out64).all():
        return math.inf
    ref_norm = torch.linalg.vector_norm(ref64).item()
    if ref_norm == 0.0:
        raise ValueError("the reference is all zeros: the check would prove nothing")
    return torch.linalg.vector_norm(out64 - ref64).item() / ref_norm
