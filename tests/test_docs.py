"""The documentation keeps up with the code: every record field in docs/bus.md, every hook documented, every command
in the README."""

from __future__ import annotations

import inspect
import re

from conftest import REPO

from trainmeter_core import hookspecs
from trainmeter_core import records as rec
from trainmeter_core.cli import COMMANDS


def test_docs_bus_lists_every_kind_and_every_field():
    text = (REPO / "docs" / "bus.md").read_text()
    for kind, cls in rec.KINDS.items():
        section = text.split(f"### `{kind}`", 1)
        assert len(section) == 2, f"docs/bus.md has no section for {kind}"
        body = section[1].split("\n### ", 1)[0]
        for field in cls.__struct_fields__:
            if field in rec.Record.__struct_fields__:
                assert f"| `{field}` |" in text  # the header table
            else:
                assert f"| `{field}` |" in body, f"docs/bus.md does not document {kind}.{field}"


def test_every_hookspec_has_a_docstring_that_documents_it():
    specs = [
        f for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("trainmeter_")
    ]
    assert len(specs) >= 10
    for spec in specs:
        doc = inspect.getdoc(spec) or ""
        assert len(doc.split()) >= 15, f"{spec.__name__} needs a docstring that a plugin author can work from"


def test_every_builtin_command_is_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for name in COMMANDS:
        assert f"`tm {name}" in readme, f"README.md does not mention tm {name}"


def test_the_readme_quick_start_has_exactly_two_commands():
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", quick, re.S)
    commands = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(commands) == 2
    for command in commands:
        script = command.split()[0]
        assert (REPO / script).exists()
