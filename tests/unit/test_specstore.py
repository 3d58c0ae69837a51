"""Tests for trainmeter_core.run.specstore: the built-in spec files, plugin spec files, and what is refused."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from trainmeter_core.model.device_specs import SpecError
from trainmeter_core.run import specstore
from trainmeter_core.run.specstore import builtin_spec_dir, load_spec_file, load_specs

REPO_SPECS = Path(__file__).resolve().parents[2] / "specs"

REQUIRED_IDS = {
    "h100-sxm", "h100-pcie", "h100-nvl", "h200-sxm", "h200-nvl", "gh200",
    "a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb", "a100-pcie-80gb",
    "b200", "gb200", "l40s", "l40", "l4", "a10", "rtx-4090", "rtx-6000-ada", "rtx-pro-6000-blackwell-server",
}  # fmt: skip


def plugin_spec(spec_id="gb10", **overrides):
    data = {
        "id": spec_id,
        "display_name": "NVIDIA GB10",
        "architecture": "blackwell",
        "adapter": "spark",
        "match": [r"\bGB10\b"],
        "exclude": [],
        "sm_count": {"value": None, "sources": [], "note": "not on the datasheet"},
        "dense_bf16_tflop_per_s": {"value": None, "sources": [], "note": "the datasheet gives FP4 only"},
        "tensor_clock_mhz": {"value": None, "sources": [], "note": "not on the datasheet"},
        "memory_kind": "LPDDR5X",
        "memory_gb": {"value": 128, "sources": [{"url": "https://example.com/gb10", "quote": "128 GB"}]},
        "memory_bandwidth_gbps": {"value": None, "sources": [], "note": "not on the datasheet"},
        "checked": "2026-11-29",
    }
    data.update(overrides)
    return data


def write(folder: Path, name: str, data) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_every_builtin_spec_file_loads_and_validates():
    specs = load_specs()
    assert REQUIRED_IDS <= {s.id for s in specs}
    # One spec per file: every JSON file in specs/ became exactly one spec.
    assert len(specs) == len(list(builtin_spec_dir().glob("*.json")))


def test_builtin_specs_are_read_from_the_repository_specs_folder_when_not_installed():
    assert builtin_spec_dir() == REPO_SPECS


def test_an_installed_package_carries_its_specs_inside_itself(tmp_path, monkeypatch):
    # The wheel force-includes specs/ as trainmeter_core/specs; when that folder exists it wins.
    (tmp_path / "specs").mkdir()
    monkeypatch.setattr(specstore.importlib.resources, "files", lambda package: tmp_path)
    assert builtin_spec_dir() == tmp_path / "specs"


def test_each_builtin_spec_is_named_after_its_id_and_dated():
    for path in sorted(REPO_SPECS.glob("*.json")):
        spec = load_spec_file(path)
        assert spec.id == path.stem
        # every file was checked on or after the day the built-in quotes were first matched
        assert datetime.date.fromisoformat(spec.checked) >= datetime.date(2026, 11, 29)


def test_every_builtin_figure_cites_its_words_or_says_why_it_is_unknown():
    for spec in load_specs():
        for name in (
            "sm_count",
            "dense_bf16_tflop_per_s",
            "tensor_clock_mhz",
            "memory_gb",
            "memory_bandwidth_gbps",
            "dense_bf16_flop_per_clock_per_sm",
            "fp32_cores_per_sm",
        ):
            figure = getattr(spec, name)
            if figure.value is None:
                assert figure.note and figure.note.strip(), (spec.id, name)
            else:
                assert figure.sources, (spec.id, name)
                assert all(s.url.startswith("https://") and s.quote.strip() for s in figure.sources), (
                    spec.id,
                    name,
                )


def test_a_plugin_folder_adds_its_specs_after_the_builtin_ones(tmp_path):
    write(tmp_path / "plugin_specs", "gb10.json", plugin_spec())
    specs = load_specs([tmp_path / "plugin_specs"])
    assert specs[-1].id == "gb10"
    assert specs[-1].adapter == "spark"
    assert len(specs) == len(load_specs()) + 1


def test_a_plugin_may_name_a_single_file(tmp_path):
    path = write(tmp_path, "gb10.json", plugin_spec())
    assert load_specs([path])[-1].origin == str(path)


def test_a_plugin_reusing_a_builtin_id_is_an_error_naming_both_files(tmp_path):
    path = write(tmp_path, "my-h100.json", plugin_spec(spec_id="h100-sxm"))
    with pytest.raises(SpecError) as caught:
        load_specs([path])
    message = str(caught.value)
    assert message.startswith(f"{path}: spec id 'h100-sxm' is already defined by ")
    assert str(REPO_SPECS / "h100-sxm.json") in message


def test_two_plugin_files_with_one_id_are_an_error(tmp_path):
    first = write(tmp_path / "a", "gb10.json", plugin_spec())
    second = write(tmp_path / "b", "gb10-again.json", plugin_spec())
    with pytest.raises(SpecError, match=f"is already defined by {first}"):
        load_specs([first, second])


def test_a_plugin_null_without_a_note_is_refused_naming_its_file(tmp_path):
    path = write(tmp_path, "gb10.json", plugin_spec(memory_bandwidth_gbps={"value": None, "sources": []}))
    with pytest.raises(SpecError, match=f"^{path}: memory_bandwidth_gbps is null without a note"):
        load_specs([path])


def test_a_file_that_is_not_json_is_refused_naming_it(tmp_path):
    path = write(tmp_path, "broken.json", '{"id": "broken",')
    with pytest.raises(SpecError, match=f"^{path}: is not valid JSON"):
        load_spec_file(path)


def test_a_file_holding_a_list_is_refused(tmp_path):
    path = write(tmp_path, "list.json", [plugin_spec()])
    with pytest.raises(SpecError, match="holds one JSON object, not list"):
        load_spec_file(path)


def test_a_missing_extra_path_is_an_error_not_silence(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(SpecError, match=f"^{missing}: no such spec file or folder"):
        load_specs([missing])
