"""tm's errors are raised where the problem is found and become one line and an exit status at the command's edge
(``cli.main``): 2 for a command line tm cannot take, 127 for a command that is not there, 126 for one that cannot be
executed; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import pytest

from trainmeter_core.commands import cli
from trainmeter_core.errors import CommandNotStartable, TmError, UsageError
from trainmeter_core.run.child import resolve_command
from trainmeter_core.run.identity import open_run


def test_a_missing_script_raises_not_found_with_the_line_a_shell_would_give(tmp_path):
    with pytest.raises(CommandNotStartable) as raised:
        resolve_command([str(tmp_path / "train.py")], script_mode=True)
    assert raised.value.exit_status == 127
    assert str(raised.value) == (
        f"{tmp_path / 'train.py'}: no such file (to run a command rather than a script: tm -- CMD ARGS)"
    )


def test_a_folder_without_main_or_a_file_without_the_execute_bit_raises_not_executable(tmp_path):
    with pytest.raises(CommandNotStartable) as folder:
        resolve_command([str(tmp_path)], script_mode=True)
    assert (folder.value.exit_status, str(folder.value)) == (
        126,
        f"{tmp_path}: is a directory without __main__.py",
    )
    plain = tmp_path / "run.sh"
    plain.write_text("echo hi\n")
    with pytest.raises(CommandNotStartable) as file:
        resolve_command([str(plain)], script_mode=False)
    assert (file.value.exit_status, str(file.value)) == (126, f"{plain}: not executable")


def test_a_runs_folder_that_cannot_be_made_is_a_usage_error(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("a file where the runs folder should be\n")
    with pytest.raises(UsageError) as raised:
        open_run("train", str(blocker), 0.0)
    assert raised.value.exit_status == 2 and "\n" not in str(raised.value)


def test_the_edge_prints_the_one_line_in_tms_voice_and_returns_its_status(monkeypatch, capsys):
    def refuses(argv: list[str]) -> int:
        raise TmError("the device is busy: retry when it is idle", 1)

    monkeypatch.setitem(cli.COMMANDS, "runs", refuses)
    assert cli.main(["runs"]) == 1
    assert capsys.readouterr().err == "tm: the device is busy: retry when it is idle\n"


def test_a_command_that_cannot_start_exits_127_from_the_edge(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TM_ACTIVE", raising=False)  # else tm would step aside for an outer tm
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert cli.main(["--runs-dir", str(tmp_path / "runs"), "--", str(tmp_path / "no-such-program")]) == 127
    assert capsys.readouterr().err == f"tm: {tmp_path / 'no-such-program'}: no such file\n"
    assert not (tmp_path / "runs").exists()  # refused before any run directory was made


def test_a_bug_keeps_its_traceback(monkeypatch):
    def broken(argv: list[str]) -> int:
        raise KeyError("a bug, not a user's mistake")

    monkeypatch.setitem(cli.COMMANDS, "runs", broken)
    with pytest.raises(KeyError):
        cli.main(["runs"])
