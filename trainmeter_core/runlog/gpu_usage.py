"""The run's GPU samples read from its log into ``paid_time.GpuUsage`` (each GPU's GPU-Util and peak memory over the
whole run), for the summaries ``tm runs RUN`` and ``tm report`` give. Reads the log; writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from trainmeter_core.model import paid_time, records
from trainmeter_core.runlog.reader import read_log


def gpu_usage(run_dir: Path) -> paid_time.GpuUsage:
    """Every ``sample.gpu`` of the run's log, every attempt's (the reader passes the other kinds by their tag)."""
    usage = paid_time.GpuUsage()
    for record in read_log(run_dir, kinds={"sample.gpu"}):
        if isinstance(record, records.SampleGpu):
            usage.feed(record)
    return usage
