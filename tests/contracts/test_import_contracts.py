"""The import-linter contracts in pyproject.toml bite: on a copy of the tree, one planted import breaks exactly the
contract it targets, and lint-imports names that contract and the planted line. A contract nobody has seen fail is
not a contract, so every contract in pyproject.toml must have its plant here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tm_runs import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web")
CONTRACTS = {
    c["id"]: c
    for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
}

# contract id -> (module file, the line appended to it, the import edge lint-imports must report)
PLANTS = {
    "layers": (
        "trainmeter_core/runlog/recorder.py",
        "import trainmeter_core.bus.hub",
        "trainmeter_core.runlog.recorder -> trainmeter_core.bus.hub",
    ),
    "engine-layers": (
        "trainmeter_core/model/engine/builder.py",
        "from trainmeter_core.model.engine.engine import Engine",
        "trainmeter_core.model.engine.builder -> trainmeter_core.model.engine.engine",
    ),
    "core-alone": (
        "trainmeter_core/commands/runs.py",
        "import trainmeter_web",
        "trainmeter_core.commands.runs -> trainmeter_web",
    ),
    "edges-apart": (
        "trainmeter_sources/host_sampler.py",
        "import trainmeter_web.guard",
        "trainmeter_sources.host_sampler -> trainmeter_web.guard",
    ),
    "agent-allowed": (
        "trainmeter_agent/_phases.py",
        "import trainmeter_core.model.catalog",
        "trainmeter_agent._phases -> trainmeter_core.model.catalog",
    ),
    "agent-light": (
        "trainmeter_core/model/redaction.py",
        "import pluggy",
        "trainmeter_core.model.redaction -> pluggy",
    ),
    "no-torch": (
        "trainmeter_sources/host_sampler.py",
        "import torch",
        "trainmeter_sources.host_sampler -> torch",
    ),
    "plugins-public": (
        "plugins/trainmeter-webhook/trainmeter_webhook/formats.py",
        "from trainmeter_core.model import records",
        "trainmeter_webhook.formats -> trainmeter_core.model.records",
    ),
    "pure": (
        "trainmeter_core/model/flops.py",
        "import subprocess",
        "trainmeter_core.model.flops -> subprocess",
    ),
}

# More plants where a contract must reach inside a package or a renamed module: the records package's modules are
# held by agent-light and pure as the single records.py was, the block the agent fills among them.
INNER_PLANTS = {
    "agent-light in the records codec": (
        "agent-light",
        "trainmeter_core/model/records/codec.py",
        "import pluggy",
        "trainmeter_core.model.records.codec -> pluggy",
    ),
    "agent-light in the agent's block": (
        "agent-light",
        "trainmeter_core/model/records/block.py",
        "import pluggy",
        "trainmeter_core.model.records.block -> pluggy",
    ),
    "pure in a records family": (
        "pure",
        "trainmeter_core/model/records/loop.py",
        "import socket",
        "trainmeter_core.model.records.loop -> socket",
    ),
}


def plugin_folders(root: Path) -> list[Path]:
    return sorted(p for p in (root / "plugins").iterdir() if (p / "pyproject.toml").exists())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The packages, the plugins' packages and pyproject.toml, copied as they are in the repository."""
    root = tmp_path_factory.mktemp("tree")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=ignore)
    for folder in plugin_folders(REPO):
        for package in folder.glob("trainmeter_*/__init__.py"):
            shutil.copytree(
                package.parent, root / "plugins" / folder.name / package.parent.name, ignore=ignore
            )
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # The copy comes first on the path, before the editable installs of this checkout and its plugins.
    path = [str(root), *(str(root / "plugins" / p.name) for p in plugin_folders(REPO))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def broken_contracts(output: str) -> set[str]:
    """The ids of the contracts lint-imports reported BROKEN (a long name wraps over lines in its summary)."""
    summary = " ".join(output.split("Broken contracts", 1)[0].split())
    return {cid for cid, c in CONTRACTS.items() if f"{' '.join(c['name'].split())} BROKEN" in summary}


def test_every_contract_has_a_plant_and_the_untouched_copy_keeps_them_all(pristine):
    assert set(PLANTS) == set(CONTRACTS)
    done = lint_imports(pristine)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in done.stdout


@pytest.mark.parametrize("contract", sorted(PLANTS))
def test_one_planted_import_breaks_exactly_its_contract(pristine, tmp_path, contract):
    planted_breaks_exactly(pristine, tmp_path, contract, *PLANTS[contract])


@pytest.mark.parametrize("plant", sorted(INNER_PLANTS))
def test_a_planted_import_inside_a_package_breaks_exactly_its_contract(pristine, tmp_path, plant):
    planted_breaks_exactly(pristine, tmp_path, *INNER_PLANTS[plant])


def planted_breaks_exactly(
    pristine: Path, tmp_path: Path, contract: str, module: str, line: str, edge: str
) -> None:
    root = tmp_path / "tree"
    shutil.copytree(pristine, root)
    with open(root / module, "a", encoding="utf-8") as source:
        source.write(f"\n{line}  # planted\n")
    done = lint_imports(root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert broken_contracts(done.stdout) == {contract}, done.stdout
    report = done.stdout.split("Broken contracts", 1)[1]
    assert edge in report, report


def test_every_plugin_distribution_is_checked_by_the_contracts():
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    for folder in plugin_folders(REPO):
        project = tomllib.loads((folder / "pyproject.toml").read_text())
        for package in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
            assert package in settings["root_packages"], f"{folder.name}: {package} is not a root package"
            assert package in CONTRACTS["plugins-public"]["source_modules"], (
                f"{package} is not held to the API"
            )
            assert package in CONTRACTS["edges-apart"]["modules"]
            assert package in CONTRACTS["no-torch"]["source_modules"]
