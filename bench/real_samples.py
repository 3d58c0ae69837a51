"""A real NVML sample of an H200, for the benches that feed GPU samples: one from the middle of the fixture's run
(``tests/fixtures/real/h200-nanogpt-kill``), with its GPM window, clocks, energy counter, PCIe and NVLink rates and the
``absent`` reason every sample carries (about 1 KB a line): what a node's sampler sends for each GPU at each beat."""

from __future__ import annotations

from pathlib import Path

import msgspec

from trainmeter_core.model import records

REAL_GPU_LOG = (
    Path(__file__).resolve().parent.parent / "tests/fixtures/real/h200-nanogpt-kill/events-0001.jsonl"
)


def real_gpu_sample() -> records.SampleGpu:
    """The fixture's middle sample that has a GPM window."""
    with open(REAL_GPU_LOG, "rb") as lines:
        samples = [line for line in lines if b'"kind":"sample.gpu"' in line and b'"gpm_window_s"' in line]
    return msgspec.json.decode(samples[len(samples) // 2], type=records.SampleGpu)
