"""The ``tm`` command line as a newcomer meets it: no abbreviations, a misspelt option or command names the one meant,
the help lists every command and option (the plugins' too), and a bad ``--kind`` is an error that lists the kinds.
"""

from __future__ import annotations

import sys

import pytest
from test_plugins import fake_distribution
from tm_runs import run_tm

from trainmeter_core.commands import cli
from trainmeter_core.model import records
from trainmeter_core.model.alerts import BUILTIN_RULES


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_misspelt_option_before_its_value_names_the_real_one_instead_of_a_missing_argument(capsys):
    # `1e6` must not be taken for the command, nor `--budget-token` for `--budget-tokens` missing its value.
    code, _, err = run_main(["--budget-token", "1e6", "x.py"], capsys)
    assert code == 2
    assert err == (
        "tm: unknown option --budget-token: did you mean --budget-tokens? "
        "(tm --help lists tm's options and the plugins')\n"
    )


def test_an_abbreviated_option_with_its_value_attached_is_refused_not_expanded(capsys):
    code, _, err = run_main(["--budget-token=1e6", "--", sys.executable, "-c", "raise SystemExit(3)"], capsys)
    assert code == 2
    assert err.startswith("tm: unknown option --budget-token: did you mean --budget-tokens?")


def test_an_unknown_option_far_from_any_is_named_without_a_guess(capsys):
    code, _, err = run_main(["--frobnicate", "x.py"], capsys)
    assert code == 2
    assert err == "tm: unknown option --frobnicate (tm --help lists tm's options and the plugins')\n"


def test_a_plugins_option_is_suggested_too(capsys):
    # trainmeter-webhook is installed by ./scripts/setup: its options are tm's once it is loaded.
    pytest.importorskip("trainmeter_webhook")
    code, _, err = run_main(["--webhook-ur", "http://x", "x.py"], capsys)
    assert code == 2
    assert "did you mean --webhook-url?" in err


def test_a_misspelt_command_says_which_command_was_meant_rather_than_no_such_file(capsys):
    code, _, err = run_main(["veiw"], capsys)
    assert code == 2
    assert err == "tm: no command `tm veiw` and no file veiw: did you mean `tm view`?\n"


@pytest.mark.xdist_group("heavy")
def test_a_file_named_like_a_command_is_still_run_as_a_script(tm_env, tmp_path):
    # Only a name that is no file gets the guess: with ./veiw there, `tm veiw` runs it.
    (tmp_path / "veiw").write_text("print('ran veiw')\n")
    result = run_tm(["veiw"], tm_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran veiw\n" and "did you mean" not in result.stderr


def test_subcommands_take_no_abbreviations_and_name_the_option_meant(capsys):
    code, _, err = run_main(["runs", "--runs", "x"], capsys)
    assert code == 2
    assert err == "tm: unknown option --runs: did you mean --runs-dir? (tm runs --help)\n"
    code, _, err = run_main(["tail", "--kin", "step"], capsys)
    assert code == 2
    assert err == "tm: unknown option --kin: did you mean --kind? (tm tail --help)\n"


def test_tail_with_an_unknown_kind_is_an_error_listing_every_kind(capsys, tmp_path):
    code, out, err = run_main(["tail", "--runs-dir", str(tmp_path), "--kind", "stepp"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("tm: no record kind stepp (did you mean step?): the kinds are run.start, run.end,")
    for kind in records.KINDS:
        assert kind in err
    assert len(err.splitlines()) == 1


def test_help_lists_doctor_and_the_plugins_options(capsys):
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0
    commands = out.split("or one of:\n", 1)[1].split("\n\n", 1)[0]
    assert "\n  doctor " in f"\n{commands}"
    for name in cli.COMMANDS:
        assert f"  {name}" in commands
    pytest.importorskip("trainmeter_webhook")
    assert "Run options from webhook (trainmeter-webhook):" in out
    assert "  --webhook-url URL    where to POST each alert" in out
    # A plugin's dest is an environment variable's name: the choices are shown instead.
    assert "--webhook-format {json,slack,ntfy,telegram}" in out and "TM_WEBHOOK_FORMAT" not in out


def test_view_help_shows_the_dashboards_port_and_host(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["view", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--port PORT" in out and "--host HOST" in out and "--json" in out and "--runs-dir" in out


def test_view_json_and_a_bad_view_option_are_one_line(capsys, tmp_path):
    code, _, err = run_main(["view", "--runs-dir", str(tmp_path), "--prot", "1"], capsys)
    assert code == 2
    assert err == "tm: unknown option --prot: did you mean --port? (tm view --help)\n"
    code, _, err = run_main(["view", "--json", "--runs-dir", str(tmp_path)], capsys)
    assert code == 2 and err.startswith("tm: no runs under ")


@pytest.mark.xdist_group("heavy")
def test_a_plugin_command_and_a_misspelt_one_from_a_subprocess(tm_env):
    # The installed `tm` agrees: doctor is a plugin's command, and `tm docter` names it.
    result = run_tm(["docter"], tm_env)
    assert result.returncode == 2
    assert result.stderr == "tm: no command `tm docter` and no file docter: did you mean `tm doctor`?\n"


@pytest.mark.xdist_group("heavy")
def test_an_unknown_alerts_table_in_tm_toml_exits_2_listing_the_rules_loaded(tm_env, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    (tmp_path / "tm.toml").write_text("[alerts.hungg]\nfloor_s = 5\n")
    result = run_tm([str(script)], tm_env)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"tm: {tmp_path / 'tm.toml'} [alerts.hungg]: no such alert rule (did you mean [alerts.hung]?)"
    )
    assert line.endswith("; the rules loaded: " + ", ".join(sorted(c.name for c in BUILTIN_RULES)))
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.xdist_group("heavy")
def test_a_table_of_a_plugins_rule_is_accepted_when_that_plugin_is_loaded(tm_env, tmp_path):
    site = tmp_path / "site"
    fake_distribution(
        site,
        "tm-myrule",
        "[trainmeter]\nmyrule = tm_myrule\n",
        "from trainmeter_core import hookimpl\n\n"
        "class MyRule:\n    name = 'my_rule'\n    severity = 'warning'\n    defaults = {'x': 0.5}\n"
        "    def evaluate(self, state, snapshot):\n        return None\n\n"
        "@hookimpl\ndef trainmeter_alert_rules():\n    return [MyRule()]\n",
    )
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    (tmp_path / "tm.toml").write_text("[alerts.my_rule]\nx = 1\n")
    result = run_tm(["--no-web", str(script)], dict(tm_env, PYTHONPATH=str(site)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    # Without the plugin, the same table names no rule loaded.
    result = run_tm(["--no-web", str(script)], tm_env)
    assert (
        result.returncode == 2
        and "[alerts.my_rule]: no such alert rule; the rules loaded: died," in result.stderr
    )


@pytest.mark.xdist_group("heavy")
def test_tm_runs_in_a_folder_without_runs_says_where_it_looked_and_how_to_look_elsewhere(tm_env, tmp_path):
    env = dict(tm_env)
    env.pop("TM_RUNS_DIR")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_tm(["runs"], env, cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"no runs under {elsewhere / '.trainmeter' / 'runs'}: tm keeps a run under the folder it was started in; "
        "pass --runs-dir DIR (or set TM_RUNS_DIR) to look elsewhere\n"
    )
    # Told where to look, it names what told it.
    result = run_tm(["runs", "--runs-dir", str(tmp_path / "none")], env, cwd=elsewhere)
    assert result.stdout == f"no runs under {tmp_path / 'none'} (from --runs-dir)\n"
    result = run_tm(["runs"], {**env, "TM_RUNS_DIR": str(tmp_path / "none")}, cwd=elsewhere)
    assert result.stdout == f"no runs under {tmp_path / 'none'} (from TM_RUNS_DIR)\n"
