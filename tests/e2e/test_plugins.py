"""Plugins load one by one: a broken entry point is reported with its error and everything else still loads."""

from __future__ import annotations

import json

from tm_runs import run_tm


def fake_distribution(site, name, entry_points, module_source=None):
    """A dist-info on a folder put on the subprocess's path: a plugin 'installed' without pip."""
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"  # as pip names it: one dash, before the version
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    if module_source is not None:
        (site / f"{name.replace('-', '_')}.py").write_text(module_source)


def test_broken_entry_point_is_reported_and_the_rest_loads(tm_env, tmp_path):
    site = tmp_path / "site"
    fake_distribution(site, "tm-broken", "[trainmeter]\nbroken = tm_no_such_module_xyz:plugin\n")
    fake_distribution(
        site,
        "tm-good",
        "[trainmeter]\ngood = tm_good\n",
        "from trainmeter_core import hookimpl\n\n@hookimpl\ndef trainmeter_secret_options():\n    return ['--good-token']\n",
    )
    env = dict(tm_env, PYTHONPATH=str(site))
    result = run_tm(["plugins", "--json"], env)
    assert result.returncode == 0, result.stderr
    infos = {i["name"]: i for i in map(json.loads, result.stdout.splitlines())}
    assert (
        "ModuleNotFoundError" in infos["broken"]["error"]
        and "tm_no_such_module_xyz" in infos["broken"]["error"]
    )
    assert infos["broken"]["distribution"] == "tm-broken"
    assert infos["good"]["provides"] == ["secret_options"] and infos["good"]["version"] == "0.1"
    assert "components" in infos["sources"]["provides"]  # the built-ins load through the same entry points

    text = run_tm(["plugins"], env).stdout
    assert "broken" in text and "FAILED" in text


def test_a_run_still_works_with_a_broken_plugin_installed(tm_env, tmp_path):
    site = tmp_path / "site"
    fake_distribution(site, "tm-broken", "[trainmeter]\nbroken = tm_no_such_module_xyz:plugin\n")
    env = dict(tm_env, PYTHONPATH=str(site))
    result = run_tm(["--", "python", "-c", "pass"], env)
    assert result.returncode == 0
    assert "plugin broken" in result.stderr
