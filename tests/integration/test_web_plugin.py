"""The dashboard's registration: the ``web`` component, ``tm view``, ``tm report`` and ``tm compare -o`` through the
entry point, and nothing heavy."""

from __future__ import annotations

import subprocess
import sys

from tm_runs import REPO

from trainmeter_core.plugins import Plugins


def test_the_plugin_registers_the_web_component_in_its_own_process_and_its_commands():
    from trainmeter_web import plugin

    plugins = Plugins()
    plugins.register(plugin, name="web", builtin=True)
    (classes,) = [c for name, c in plugins.per_plugin("trainmeter_components") if name == "web"]
    (web,) = classes
    assert web.name == "web" and web.shared is False  # aiohttp never enters the shared components process
    (commands,) = [c for name, c in plugins.per_plugin("trainmeter_commands") if name == "web"]
    assert [c.name for c in commands] == ["view", "report", "compare"]  # compare completes tm's own with -o


def test_loading_the_plugin_and_its_classes_imports_no_aiohttp():
    code = (
        "import sys\n"
        "from trainmeter_web import plugin\n"
        "plugin.trainmeter_components(); plugin.trainmeter_commands()\n"
        "print('aiohttp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_the_view_command_takes_the_options_tm_view_documents():
    import argparse

    from trainmeter_web.view import ViewCommand

    parser = argparse.ArgumentParser()
    ViewCommand().add_arguments(parser)
    args = parser.parse_args(["myrun", "--port", "9000", "--host", "0.0.0.0", "--runs-dir", "/r"])
    assert (args.run, args.port, args.host, args.runs_dir, args.json) == (
        ["myrun"],
        9000,
        "0.0.0.0",
        "/r",
        False,
    )


def test_the_view_command_takes_several_runs_to_show_side_by_side():
    import argparse

    from trainmeter_web.view import ViewCommand

    parser = argparse.ArgumentParser()
    ViewCommand().add_arguments(parser)
    assert parser.parse_args(["a", "b", "c"]).run == ["a", "b", "c"]
    assert parser.parse_args([]).run == []  # the latest run
