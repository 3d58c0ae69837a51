"""What kind of work a GPU activity is, from its name and category: tm's classes and HTA's kernel types.

Pure: no I/O, no clock. Every rule here is listed, with its reason, in docs/profiles.md; a rule changed here must be
changed there. The classes never guess a number: they only sort time into named bins.
"""

from __future__ import annotations

import re

#: tm's classes, in the order the exclusive split gives way: where two run at once, the earlier class takes the time.
GEMM, ATTENTION, OTHER_COMPUTE, COMMUNICATION, MEMORY = range(5)
CLASS_NAMES = ("gemm", "attention", "other_compute", "communication", "memory")
COMPUTE_CLASSES = (GEMM, ATTENTION, OTHER_COMPUTE)
#: The parts of a window's exclusive split, which add up to the window: the classes, then idle.
SPLIT_NAMES = (*CLASS_NAMES, "idle")

#: Activity categories of a Chrome trace (and of an Nsight Systems export) that are memory operations whatever their name.
MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset", "memcpy", "memset"})

_MEMORY_NAME = re.compile(r"(?:memcpy|memset|^dma)", re.IGNORECASE)
# NCCL's kernels (ncclKernel_*, ncclDevKernel_*), ROCm's RCCL, and collectives written outside NCCL.
_COMMUNICATION_NAME = re.compile(
    r"(?:^nccl|^rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv)", re.IGNORECASE
)
_ATTENTION_NAME = re.compile(r"(?:flash|fmha|attention|attn|sdpa)", re.IGNORECASE)
# cuBLAS and CUTLASS GEMMs (gemm, xmma, nvjet, cutlass), Triton and Inductor matmul templates, cuDNN convolutions
# (implicit GEMMs; convolutions are matrix math on the same units).
_GEMM_NAME = re.compile(
    r"(?:gemm|xmma|nvjet|cutlass|cublas|matmul|_mm_|fused_mm|addmm|bmm|convolve|conv2d)", re.IGNORECASE
)


def classify(name: str, category: str = "") -> int:
    """tm's class of one GPU activity (``GEMM`` ... ``MEMORY``), by these rules in order: a memory category or a
    name with memcpy/memset (or starting with dma) is memory; an NCCL/RCCL kernel or a collective's name is
    communication; a flash/fmha/attention/attn/sdpa name is attention; a GEMM, CUTLASS, cuBLAS, matmul or
    convolution name is GEMM; anything else is other compute."""
    if category in MEMORY_CATEGORIES or _MEMORY_NAME.search(name):
        return MEMORY
    if _COMMUNICATION_NAME.search(name):
        return COMMUNICATION
    if _ATTENTION_NAME.search(name):
        return ATTENTION
    if _GEMM_NAME.search(name):
        return GEMM
    return OTHER_COMPUTE


# HTA 0.5.0's kernel types (hta/utils/utils.py), by name only: communication ^nccl.*Kernel; memory ^Memcpy, ^Memset
# or ^dma; OTHER what its "not computation" pattern matches besides those (a name containing Memcpy, starting with
# Memset, or containing Sync); computation the rest. re.match anchors each at the start, as HTA's calls do.
HTA_COMPUTATION, HTA_COMMUNICATION, HTA_MEMORY, HTA_OTHER = range(4)
HTA_TYPE_NAMES = ("COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER")
_HTA_COMM = re.compile(r"^nccl.*Kernel")
_HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def hta_type(name: str) -> int:
    """HTA's type of a GPU kernel by its name (``HTA_COMPUTATION`` ... ``HTA_OTHER``)."""
    if _HTA_COMM.match(name):
        return HTA_COMMUNICATION
    if _HTA_MEMORY.match(name):
        return HTA_MEMORY
    if _HTA_NOT_COMPUTE.match(name):
        return HTA_OTHER
    return HTA_COMPUTATION
