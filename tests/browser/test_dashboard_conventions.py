"""What a person reads on the tiles of a run whose FLOPs could be counted under one convention only: one number
with that convention, the conventions it could not compute and what each lacks; never a range whose ends are one
value, nor "range over the conventions"."""

from __future__ import annotations

from dashboard_page import GOLDEN, Served


def test_a_run_with_one_computable_convention_shows_one_number_under_it_and_what_the_others_lack(
    page, capsys
):
    # The two-rank golden run: its model reported parameters and embeddings but no layers nor width, so only hf
    # (6(N-E), no attention term) could be computed: 6 × (34,880 − 2,048) = 196,992 FLOP per token.
    served = Served(GOLDEN / "two-rank", capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function(
            "() => document.querySelector('#tile-flop_per_token .value')?.textContent.length > 0"
        )
        value = p.text_content("#tile-flop_per_token .value")
        assert value == "197 kFLOP", value  # one number, not "197 kFLOP – 197 kFLOP"
        line = p.text_content("#tile-flop_per_token .line")
        assert line.startswith("hf · "), line
        assert (
            "titan, megatron, all_params not computed: layers unknown: pass --layers; "
            "model width unknown: pass --d-model"
        ) in line
        assert "range" not in line and "agree" not in line
        # The progress card's FLOPs spent names the same convention.
        spent = p.text_content("#progress-stats")
        assert "· hf" in spent and "range over conventions" not in spent
        assert page.errors == []
    finally:
        served.stop()


def test_a_cpu_ranks_hardware_row_uses_the_measured_peak_of_its_own_threads(page, capsys):
    served = Served(GOLDEN / "two-rank", capsys)
    p = page.page
    try:
        p.goto(served.url)
        p.wait_for_function("() => document.querySelector('#tile-mfu .value')?.textContent.length > 0")
        shown = p.evaluate(
            """async () => {
                const panels = await import('/static/panels.js');
                const format = await import('/static/format.js');
                const peak = (threads, rate) => ({name: "peak", device: "vm/cpu", provenance: "detected",
                    origin: "tm peak", value: {flop_per_s: rate, label: "measured", source: `${threads} thread(s)`,
                    device_type: "cpu", dtype: "float32", threads}});
                const facts = [peak(1, 1e10), peak(2, 2e10)];  // the 2-thread one stored last
                const rank = (threads) => ({type: "cpu", index: null, uuid: null, dtype: "float32", threads});
                return {one: panels.devicePeak(facts, "vm", "cpu", rank(1)),
                        three: panels.devicePeak(facts, "vm", "cpu", rank(3)),
                        text: format.factText(facts[1]), device: format.factText({name: "device", value: rank(1)})};
            }"""
        )
        assert shown["one"] == {"flop_per_s": 1e10, "label": "measured", "source": "1 thread(s)"}
        assert shown["three"] is None  # no peak measured with 3 threads: none stands in
        assert shown["text"] == "20 GFLOP/s (measured, cpu, float32, 2 threads)"
        assert shown["device"] == "cpu (float32, 1 thread)"
        assert page.errors == []
    finally:
        served.stop()
