"""The documentation keeps up with the code: every record field in docs/bus.md, every hook documented with its Protocol
and an example that runs, every command in the README."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import textwrap
import threading
import types
import typing
from collections.abc import Sequence
from pathlib import Path

import pytest
from tm_runs import REPO

from trainmeter_core import api, hookspecs
from trainmeter_core.commands.cli import COMMANDS
from trainmeter_core.model import records
from trainmeter_core.model.alerts.episodes import rule_config
from trainmeter_core.plugins import Plugins


def test_docs_bus_lists_every_kind_and_every_field():
    text = (REPO / "docs" / "bus.md").read_text()
    for kind, cls in records.KINDS.items():
        section = text.split(f"### `{kind}`", 1)
        assert len(section) == 2, f"docs/bus.md has no section for {kind}"
        body = section[1].split("\n### ", 1)[0]
        for field in cls.__struct_fields__:
            if field in records.Record.__struct_fields__:
                assert f"| `{field}` |" in text  # the header table
            else:
                assert f"| `{field}` |" in body, f"docs/bus.md does not document {kind}.{field}"


def hook_specs() -> dict[str, object]:
    return {n: f for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("trainmeter_")}


def protocols_of(spec) -> list[type]:
    """The Protocols of trainmeter_core.api named anywhere in a hook's return annotation."""
    found, todo = [], [typing.get_type_hints(spec)["return"]]
    while todo:
        hint = todo.pop()
        if (
            isinstance(hint, type)
            and hint.__module__ == api.__name__
            and getattr(hint, "_is_protocol", False)
        ):
            found.append(hint)
        todo.extend(typing.get_args(hint))
    return found


def example_of(spec) -> str:
    doc = inspect.getdoc(spec) or ""
    assert "Example::\n" in doc, f"{spec.__name__} has no example"
    return textwrap.dedent(doc.split("Example::\n", 1)[1])


def test_every_hook_names_its_protocol_and_says_what_it_returns_and_when_it_is_called():
    specs = hook_specs()
    assert len(specs) == 10
    for name, spec in specs.items():
        doc = inspect.getdoc(spec) or ""
        protocols = protocols_of(spec)
        if protocols:
            for protocol in protocols:
                assert f"Protocol: :class:`trainmeter_core.api.{protocol.__name__}`" in doc, name
                assert protocol.__name__ in api.__all__ and protocol.__doc__, protocol
        else:
            # Only hooks answering with plain data have no Protocol: paths, names, or nothing.
            answer = typing.get_type_hints(spec)["return"]
            assert answer in (type(None), Sequence[Path], Sequence[str]), (
                f"{name} returns {answer} without a Protocol"
            )
            assert "Protocol: none" in doc, name
        assert ":return:" in doc, name
        for parameter in inspect.signature(spec).parameters:
            assert f":param {parameter}:" in doc, f"{name} does not document {parameter}"
        assert "Called " in doc or "Not called yet" in doc, f"{name} does not say when and where it is called"


class StandInContext:
    """What a component sees of its context: the records given (then a stop), and what it published."""

    def __init__(self, got):
        self.stopping = threading.Event()
        self.published = []
        self._records = list(got)
        self.meta, self.run_dir = {"run_id": "r1"}, None

    def recv(self, timeout_s):
        if self._records:
            return self._records.pop(0)
        self.stopping.set()
        return None

    def records(self, timeout_s=0.5):
        while not self.stopping.is_set():
            record = self.recv(timeout_s)
            if record is not None:
                yield record

    def publish(self, record):
        self.published.append(record)
        return True


class RecordingEmit:
    def __init__(self):
        self.on, self.values = True, []

    def __call__(self, values, step=None):
        self.values.append((dict(values), step))

    def stop(self, exc):
        self.on = False


def exercise_components(answer, tmp_path, capsys):
    (cls,) = answer
    ctx = StandInContext([records.Step(step=n) for n in (1, 2, 3)])
    cls().run(ctx)
    assert [(n.topic, n.message) for n in ctx.published] == [("step-counter", "3 steps seen")]


def exercise_sinks(answer, tmp_path, capsys):
    (cls,) = answer
    alert = records.Alert(rule="hung", state="fired", severity="critical", message="no step for 300 s")
    cls().run(StandInContext([records.Tick(n=1, interval_s=1.0), alert]))
    assert capsys.readouterr().out == "hung fired: no step for 300 s\n"


def exercise_alert_rules(answer, tmp_path, capsys):
    (rule,) = answer
    state = api.RuleState(config=rule_config(rule, None))

    def median(value_s):
        return records.Snapshot(tick=1, metrics={"step_time_median_s": records.MetricValue(value=value_s)})

    assert (
        state.config["max_step_s"] == 5.0 and state.config["clear_after_s"] == 60.0
    )  # its own and the common
    assert rule.evaluate(state, records.Snapshot(tick=1)).held
    assert [c.message for c in rule.evaluate(state, median(6.0)).active] == ["steps take 6.0 s"]
    assert [c.message for c in rule.evaluate(state, median(2.0)).normal] == ["steps take 2.0 s again"]


def exercise_platform_adapters(answer, tmp_path, capsys):
    ((name, cls),) = answer.items()
    adapter = cls()
    assert adapter.name == name and not adapter.offers("pcie_rx_bps") and adapter.offers("power_w")
    reading = api.GpuReading()
    adapter.adapt(reading)
    # Either the machine has the thermal zone (a value) or not (the reason): never nothing.
    assert reading.has("temp_c") or reading.absent["temp_c"].startswith("thermal zone not readable")


def exercise_device_specs(answer, tmp_path, capsys):
    assert answer == [tmp_path / "specs"]


def exercise_trackers(answer, tmp_path, capsys):
    (tap,) = answer
    logged = []
    library = types.ModuleType(tap.module)
    library.log = lambda key, value, step=None: logged.append((key, value, step))
    emit = RecordingEmit()
    tap.attach(library, emit)
    library.log("loss", 1.5, step=3)
    assert logged == [("loss", 1.5, 3)] and emit.values == [({"loss": 1.5}, 3)]


def exercise_profiler_importers(answer, tmp_path, capsys):
    (importer,) = answer
    trace = tmp_path / "rank0.kernels.jsonl"
    trace.write_text(
        '{"name": "sm90_xmma_gemm_bf16", "start_ns": 0, "end_ns": 3000000, "stream": 7}\n'
        '{"name": "ncclDevKernel_AllReduce", "start_ns": 2000000, "end_ns": 5000000, "stream": 20}\n'
    )
    assert importer.can_read(trace) and not importer.can_read(tmp_path / "rank0.json")
    (record,) = importer.read(trace, {"run_id": "r1", "host": "n1"})
    assert isinstance(record, api.ProfileImport) and record.scope == "trace" and record.host == "n1"
    # The window is the kernels' span, 0 to 5 ms: GEMM runs 0-3 ms, NCCL 2-5 ms. The split gives GEMM its 3 ms and
    # communication only its exposed 2 ms (3-5); nothing idle; they overlap 1 ms (2-3).
    assert record.window_s == 0.005
    assert record.split_s["gemm"] == 0.003 and record.split_s["communication"] == 0.002
    assert record.split_s["idle"] == 0.0 and record.kernel_s["communication"] == 0.003
    assert record.overlap_s["communication_compute"] == 0.001


def exercise_commands(answer, tmp_path, capsys):
    (command,) = answer
    parser = argparse.ArgumentParser(prog=f"tm {command.name}")
    command.add_arguments(parser)
    assert command.run(parser.parse_args(["tm"])) == 0
    assert capsys.readouterr().out == "hello, tm\n"


def exercise_add_options(answer, tmp_path, capsys, parser):
    assert parser.parse_args(["--journal-file", "j.md"]).TM_JOURNAL_FILE == "j.md"


def exercise_secret_options(answer, tmp_path, capsys):
    assert answer and all(isinstance(n, str) for n in answer)


@pytest.mark.parametrize("name", sorted(hook_specs()))
def test_every_hook_example_is_a_plugin_of_the_public_api_that_works(name, tmp_path, capsys):
    spec = hook_specs()[name]
    code = example_of(spec)
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            assert all(m == "trainmeter_core.api" or not m.startswith("trainmeter") for m in modules), modules
    module = types.ModuleType(f"example_{name}")
    module.__file__ = str(tmp_path / "example.py")
    exec(compile(code, module.__file__, "exec"), module.__dict__)
    plugins = Plugins()
    plugins.register(module, name="example")  # pluggy checks the implementation against the hookspec
    kwargs = {"parser": argparse.ArgumentParser()} if name == "trainmeter_add_options" else {}
    answers = [answer for plugin, answer in plugins.per_plugin(name, **kwargs) if plugin == "example"]
    assert plugins.errors() == [] and (answers or name == "trainmeter_add_options")
    answer = answers[0] if answers else None
    for protocol in protocols_of(spec):
        items = answer.values() if isinstance(answer, dict) else answer
        assert items and all(isinstance(item, protocol) for item in items), (name, protocol)
    exercise = globals()[f"exercise_{name.removeprefix('trainmeter_')}"]
    exercise(answer, tmp_path, capsys, **kwargs)


def test_the_plugin_guide_names_every_hook_with_its_protocol():
    text = (REPO / "docs" / "plugins.md").read_text()
    for name, spec in hook_specs().items():
        rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, f"docs/plugins.md has no row for {name} in its table of hooks"
        for protocol in protocols_of(spec) or []:
            assert f"`{protocol.__name__}`" in rows[0], f"docs/plugins.md does not name {protocol.__name__}"
    assert "`trainmeter_core.api`" in text and "hookimpl is all a plugin imports" not in text


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


def test_right_after_the_quick_start_the_readme_says_how_tm_gets_onto_path_and_into_ones_own_environment():
    quick = _section((REPO / "README.md").read_text(), "Quick start")
    after = quick.split("```sh\n", 1)[1].split("```\n", 1)[1].strip().split("\n\n", 1)[0]
    # The paragraph right after the two commands: the demo's last line as printed, the shell's PATH, one's own env.
    for words in ("`.venv/bin/tm view RUN`", "`. .venv/bin/activate`", "`PATH`", "pip install"):
        assert words in after, f"the README's paragraph after the quick start does not say {words}"
    code = [line for line in (REPO / "scripts" / "demo").read_text().splitlines() if not line.startswith("#")]
    # The demo runs its tm with the caller's PATH (no .venv activated), so its last line names tm as that shell can.
    assert not any("bin/activate" in line for line in code)


def test_no_product_module_is_over_650_lines_but_the_mirror_of_pynvml():
    """A module holds one idea; past 650 lines it holds more. ``fake_pynvml.py`` mirrors pynvml's one module."""
    long = []
    for package in ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web", "plugins"):
        for path in (REPO / package).rglob("*.py"):
            lines = len(path.read_text().splitlines())
            if lines > 650 and path.name != "fake_pynvml.py" and "tests" not in path.parts:
                long.append(f"{path.relative_to(REPO)} ({lines} lines)")
    assert not long, "modules over 650 lines: " + ", ".join(long)


def test_every_product_module_says_at_its_top_what_it_is_for():
    bare = []
    for package in ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web", "plugins"):
        for path in (REPO / package).rglob("*.py"):
            if "tests" in path.parts or "bench" in path.parts or not path.read_text().strip():
                continue
            if not ast.get_docstring(ast.parse(path.read_text())) and path.name != "__init__.py":
                bare.append(str(path.relative_to(REPO)))
    assert not bare, "modules without a docstring saying their idea: " + ", ".join(bare)


def test_a_module_over_500_lines_says_at_its_top_why_it_stays_whole():
    for package in ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web", "plugins"):
        for path in (REPO / package).rglob("*.py"):
            if "tests" in path.parts or len(path.read_text().splitlines()) <= 500:
                continue
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "Why one module" in docstring, (
                f"{path.relative_to(REPO)}: over 500 lines, and its top does not say why"
            )


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_readme_says_what_is_seen_without_code_and_where_the_loss_comes_from():
    readme = (REPO / "README.md").read_text()
    intro = readme.split("## ", 1)[0]
    # The agent alone sees the train loss (at backward()), not the other losses: the intro must not promise them.
    assert "losses" not in intro
    seen = _section(readme, "What tm sees without a line of code")
    for thing in (
        "**steps**",
        "**tokens**",
        "**FLOPs**",
        "--tokens-per-step",
        "**the train loss**",
        "loss.backward()",
    ):
        assert thing in seen
    others = [p for p in seen.split("\n\n") if p.startswith("The validation loss")]
    assert len(others) == 1 and "emit(val_loss=v)" in others[0] and "wandb" in others[0]


def test_the_readme_documents_each_setup_script_and_the_demo_needs_no_root():
    readme = (REPO / "README.md").read_text()
    quick = _section(readme, "Quick start")
    for script in ("`./scripts/setup --demo`", "`./scripts/setup`", "`./scripts/setup-browser`"):
        assert script in quick
    assert "needs no root and installs no browser" in quick
    assert "TM_SKIP_BROWSER" not in readme  # no hidden switch: setup never installs the browser


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    found: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def test_every_link_between_the_docs_reaches_a_file_and_its_heading():
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "plugins").glob("**/README.md")]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.relative_to(REPO)} links to {target}: no such file"
            if anchor:
                assert anchor in _anchors(linked.read_text()), (
                    f"{page.relative_to(REPO)} links to {target}: no such heading"
                )


def test_the_architecture_map_has_its_parts_and_names_every_record_kind():
    text = (REPO / "docs" / "architecture.md").read_text()
    for part in (
        "The layer map",
        "The process map",
        "The record table",
        "How a record travels",
        "Plugin entry points",
    ):
        assert f"\n## {part}\n" in text, f"docs/architecture.md has no section {part!r}"
    table = _section(text, "The record table")
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
    named = set(re.findall(r"`([a-z.]+)`", " ".join(rows)))
    assert named == set(records.KINDS), (
        f"the record table misses {set(records.KINDS) - named} or names {named - set(records.KINDS)}"
    )


def _spelled_alike(a: str, b: str) -> bool:
    """Two spellings of one key: the same words once ``flops`` reads ``flop`` (``flops_spent``, ``spent_flop``)."""

    def words(key: str) -> list[str]:
        head, _, tail = key.partition(".")
        return sorted("flop" if w == "flops" else w for w in head.split("_")) + [tail]

    return a != b and words(a) == words(b)


def _old_spellings_table() -> dict[str, tuple[str, str]]:
    """docs/api.md's table of old spellings: each old key (its head) -> (the new key's head, the release it leaves in)."""
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("#### Old spellings", 1)[1].split("\n#", 1)[0]
    table = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        old = re.findall(r"`([^`.]+)", cells[0])[0]
        new = re.findall(r"`([^`.]+)", cells[1])[0]
        table[old] = (new, cells[3])
    return table


def test_every_key_a_snapshot_or_passport_has_under_two_spellings_is_in_docs_api_with_the_release_it_leaves_in():
    import tomllib

    from trainmeter_core.model import passport
    from trainmeter_core.model.engine.snapshot import OLD_KEYS_LEAVE_IN, OLD_METRIC_KEYS
    from trainmeter_core.runlog import replay

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert tuple(map(int, OLD_KEYS_LEAVE_IN.split("."))) > tuple(map(int, version.split(".")))
    table = _old_spellings_table()
    snapshot = replay.final_snapshot(REPO / "tests" / "fixtures" / "golden" / "cpu-measured")
    # Found in what tm writes, not in its own list: every key whose value is another key's, spelled alike.
    for found in (snapshot.metrics, passport.passport_data(snapshot, {})):
        pairs = {
            tuple(sorted((a, b), key=lambda k: "flops" not in k))
            for a in found
            for b in found
            if found[a] is found[b] and found[a] is not None and _spelled_alike(a, b)
        }
        assert pairs
        for old, new in pairs:
            row = table.get(old.partition(".")[0])
            assert row is not None, f"docs/api.md does not list the old spelling {old}"
            assert row == (new.partition(".")[0], OLD_KEYS_LEAVE_IN), f"docs/api.md: {old} -> {row}"
    assert set(table) == set(OLD_METRIC_KEYS) and all(table[o][0] == n for o, n in OLD_METRIC_KEYS.items())
