"""Part 1 of gpu-check's report, its energy lines: the energy tm gives its run (NVML's total energy counter, the
integral of power where a GPU has none), and, over the measured loop, the counter's rise tm recorded beside NVML's own
delta that the loop read itself at its start and end.

The two intervals are the loop's [t0, t1] and tm's samples inside it, so each side is shown as its mean power (J / s):
on a GPU running one steady matmul they agree within a few percent; outside 0.8..1.25 it reads OFF and fails.
"""

from __future__ import annotations

from trainmeter_core.model import records


def show_energy(
    loop: dict, rows: list[records.SampleGpu], index: int, snapshot: dict, cpu: bool
) -> str | None:
    """Prints the energy lines for GPU ``index``; returns the name of a failed check, or None."""
    metrics = snapshot.get("metrics") or {}
    energy = metrics.get("energy_j") or {}
    if "value" in energy:
        print(f"  energy of the run (tm): {energy['value']:.6g} J ({energy.get('label')}), whole run")
    else:
        print(f"  energy of the run (tm): n/a ({energy.get('absent', 'not in the summary')})")
    for key in ("energy_kwh", "energy_j_per_step", "energy_j_per_token"):
        entry = metrics.get(key) or {}
        if "value" in entry:
            print(f"    {key}: {entry['value']:.4g}")
    start, end = loop.get("energy_j_t0") or {}, loop.get("energy_j_t1") or {}
    first, last = start.get(str(index)), end.get(str(index))
    if not isinstance(first, float) or not isinstance(last, float):
        why = first if isinstance(first, str) else start.get("absent") or end.get("absent") or "no reading"
        print(f"  NVML's own energy delta over the loop: n/a ({why})")
        return None
    nvml_s = loop["t1"] - loop["t0"]
    nvml_j = last - first
    inside = [
        r for r in rows if r.index == index and loop["t0"] <= r.t <= loop["t1"] and r.energy_j is not None
    ]
    if len(inside) < 2:
        print(
            f"  NVML's own delta over the loop: {nvml_j:.6g} J in {nvml_s:.1f} s; tm recorded too few counter rows"
        )
        return None
    tm_j = sum(max(0.0, b.energy_j - a.energy_j) for a, b in zip(inside, inside[1:], strict=False))  # type: ignore[operator]
    tm_s = inside[-1].t - inside[0].t
    print(f"  energy over the loop, tm's rows:   {tm_j:.6g} J in {tm_s:.1f} s = {tm_j / tm_s:.4g} W")
    print(f"  energy over the loop, NVML's own:  {nvml_j:.6g} J in {nvml_s:.1f} s = {nvml_j / nvml_s:.4g} W")
    ratio = (tm_j / tm_s) / (nvml_j / nvml_s) if nvml_j > 0 and tm_s > 0 else None
    if ratio is None:
        print("  (NVML's counter did not rise over the loop: nothing to compare)")
        return None
    good = 0.8 <= ratio <= 1.25
    verdict = "agree" if good else f"OFF x{ratio:.2f}"
    note = " (fake GPUs: each process has its own, the numbers mean nothing)" if cpu else ""
    print(f"  tm / NVML mean power: {ratio:.3f}   {verdict}{note}")
    return None if good or cpu else "energy"
