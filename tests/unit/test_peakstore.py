"""The peaks file ``tm peak`` writes: one peak per machine, device, dtype and thread count; a new measurement that
disagrees with the stored one by more than its own spread is said and kept out, unless ``--replace`` is given."""

from __future__ import annotations

import json

import pytest

from trainmeter_core.commands.peak import keep_or_store
from trainmeter_core.run import peakstore


@pytest.fixture
def peaks_file(tmp_path, monkeypatch):
    path = tmp_path / "peaks.json"
    monkeypatch.setenv("TM_PEAKS_FILE", str(path))
    return path


def entry(flop_per_s: float, spread: float, threads: int = 1, wall: float = 1_796_000_000.0) -> dict:
    return {
        "host": "vm", "device": "vm/cpu", "device_type": "cpu", "dtype": "float32", "threads": threads,
        "flop_per_s": flop_per_s, "spread_flop_per_s": spread, "source": "tm peak: a test", "measured_wall": wall,
    }  # fmt: skip


def stored(path) -> list[tuple[int, float]]:
    return sorted((e["threads"], e["flop_per_s"]) for e in json.loads(path.read_text()))


def test_a_peak_of_another_thread_count_is_stored_beside_the_first(peaks_file, capsys):
    assert keep_or_store(entry(15.9e9, 0.5e9, threads=1), replace=False) == 0
    assert keep_or_store(entry(31.0e9, 0.5e9, threads=2), replace=False) == 0
    assert stored(peaks_file) == [(1, 15.9e9), (2, 31.0e9)]
    assert "stored the peak of float32 on vm/cpu, 2 thread(s)" in capsys.readouterr().out


def test_a_measurement_that_disagrees_by_more_than_its_spread_is_said_and_kept_out_unless_replace(
    peaks_file, capsys
):
    keep_or_store(entry(15.9e9, 0.5e9, wall=1_796_000_000.0), replace=False)
    capsys.readouterr()
    # 32.6 − 15.9 = 16.7 GFLOP/s apart, far more than the new measurement's 1.2 GFLOP/s spread.
    assert keep_or_store(entry(32.6e9, 1.2e9), replace=False) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "tm peak: this measurement (32.6 GFLOP/s, spread 1.2 GFLOP/s) disagrees with the one "
    )
    assert "stored (15.9 GFLOP/s, measured 2026-11-30 00:53 UTC)" in err
    assert err.rstrip().endswith(
        "kept the stored peak of float32 on vm/cpu, 1 thread(s); measure again on an idle machine, "
        "or pass --replace to store this one"
    )
    assert stored(peaks_file) == [(1, 15.9e9)]
    # --replace stores it, and says what it replaced.
    assert keep_or_store(entry(32.6e9, 1.2e9), replace=True) == 0
    assert "(replacing the stored one: this measurement" in capsys.readouterr().out
    assert stored(peaks_file) == [(1, 32.6e9)]


def test_a_measurement_within_its_spread_of_the_stored_one_replaces_it(peaks_file):
    keep_or_store(entry(15.9e9, 0.5e9), replace=False)
    # 16.3 − 15.9 = 0.4 GFLOP/s, within the new spread of 0.6.
    assert keep_or_store(entry(16.3e9, 0.6e9), replace=False) == 0
    assert stored(peaks_file) == [(1, 16.3e9)]
    assert peakstore.stored_for(entry(0.0, 0.0))["flop_per_s"] == 16.3e9
