"""The diagnosis of a process that never said hello: one reason, one fix, for each way the agent can miss a process."""

from __future__ import annotations

import importlib.util

import pytest
from test_agent import BOOT  # the bootstrap's own dormancy list, to compare with

from trainmeter_core.model.diagnosis import Diagnosis, SilentProcess, diagnose, is_helper, is_python
from trainmeter_core.model.diagnosis import _program as program
from trainmeter_core.model.diagnosis import _without_option as without_option

TM_PYTHON = "/work/.venv/bin/python"
BOOT_DIR = "/work/trainmeter_agent/boot"
GOOD_ENV = {"TM_AGENT_ENDPOINT": "ipc:///tmp/tm-1/in", "PYTHONPATH": f"{BOOT_DIR}:/work"}


def silent(argv: list[str], **fields) -> SilentProcess:
    defaults = dict(
        executable=TM_PYTHON, python_version=(3, 11, 7), env=GOOD_ENV, boot_dir=BOOT_DIR, tm_python=TM_PYTHON
    )
    defaults.update(fields)
    return SilentProcess(argv=tuple(argv), **defaults)


def test_a_non_python_command_gets_one_line_on_what_tm_cannot_see():
    found = diagnose(silent(["./train_cuda", "--epochs", "3"], executable="/work/train_cuda"))
    assert found == Diagnosis(
        reason="train_cuda is not Python: tm shows its GPU counters and host data, but no steps, tokens or loss "
        "from inside it",
        fix=None,
    )
    assert found.line() == found.reason


def test_an_old_python_is_named_with_the_version_the_agent_needs():
    found = diagnose(
        silent(
            ["python3.8", "train.py", "--lr", "3e-4"],
            executable="/usr/bin/python3.8",
            python_version=(3, 8, 18),
        )
    )
    assert found.reason == "it runs Python 3.8.18, older than the 3.10 the agent needs"
    assert found.fix.endswith("tm -- python3.12 train.py --lr 3e-4")


@pytest.mark.parametrize(
    ("argv", "flag", "fixed"),
    [
        (["python", "-I", "train.py"], "-I", "python train.py"),
        (["python", "-uE", "train.py", "-E"], "-E", "python -u train.py -E"),  # the script's own -E stays
        (["python", "-S", "-m", "trainer.main"], "-S", "python -m trainer.main"),
        # -W takes "ignore" as its value: the -I after it is still an interpreter option.
        (["python", "-W", "ignore", "-I", "-c", "import x"], "-I", "python -W ignore -c 'import x'"),
    ],
)
def test_flags_that_keep_sitecustomize_out_are_named_and_dropped_from_the_fix(argv, flag, fixed):
    found = diagnose(silent(argv))
    assert flag in found.reason and found.fix == fixed


def test_a_cleared_environment_is_told_apart_from_a_missing_install():
    found = diagnose(silent(["python", "train.py"], env={"PATH": "/usr/bin"}))
    assert "cleared environment" in found.reason
    assert found.fix.endswith("tm -- python train.py")
    # PYTHONPATH without the boot folder is the same problem: the agent's sitecustomize is not on the path.
    assert (
        diagnose(silent(["python", "train.py"], env={**GOOD_ENV, "PYTHONPATH": "/work"})).reason
        == found.reason
    )


def test_another_interpreter_without_trainmeter_gets_the_install_command():
    other = "/opt/conda/bin/python"
    found = diagnose(silent(["python", "train.py"], executable=other, has_trainmeter=False))
    assert found == Diagnosis(
        reason=f"it runs {other}, another Python than tm's ({TM_PYTHON}), which has no trainmeter",
        fix=f"{other} -m pip install trainmeter",
    )
    unsure = diagnose(silent(["python", "train.py"], executable=other))
    assert unsure.reason.endswith("which may not have trainmeter")


def test_when_nothing_explains_it_the_fix_is_tm_doctor_on_that_python():
    found = diagnose(silent(["python", "train.py"], has_trainmeter=True))
    assert found.fix == f"tm doctor --python {TM_PYTHON}"


def test_an_unreadable_environment_is_not_taken_for_a_cleared_one():
    found = diagnose(silent(["python", "train.py"], env=None, has_trainmeter=True))
    assert "environment" not in found.reason


def test_helpers_are_silent_by_design_and_agree_with_the_bootstraps_list():
    spec = importlib.util.spec_from_file_location("tm_boot_for_diagnosis", BOOT / "sitecustomize.py")
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)  # under another name it only defines its functions
    cases = [
        [
            "python",
            "-c",
            "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4)",
            "--multiprocessing-fork",
        ],
        ["python", "-B", "-c", "from multiprocessing.forkserver import main; main(3, 4, [])"],
        ["python", "-c", "from multiprocessing.resource_tracker import main;main(3)"],
        ["python", "-m", "torch._inductor.compile_worker", "--workers=4"],
        ["python", "/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker/__main__.py"],
        ["python", "/venv/bin/torchrun", "--nproc_per_node=2", "train.py"],
        ["python", "-m", "torch.distributed.run", "train.py"],
        ["python", "train.py"],
        ["python", "-m", "torch_trainer"],
    ]
    for argv in cases:
        assert is_helper(argv) == (boot.dormant_reason(argv) is not None), argv
        if is_helper(argv):
            assert diagnose(silent(argv)) is None


def test_python_is_recognised_by_the_interpreters_name():
    assert (
        is_python(["python3.12", "x.py"])
        and is_python(["/usr/bin/pypy3"])
        and is_python(["env"], "/usr/bin/python3")
    )
    assert not is_python(["bash", "run.sh"], "/usr/bin/bash")


def test_the_program_is_found_after_the_interpreter_options():
    assert program(["python", "-u", "-X", "utf8", "train.py", "-I"]) == (["-u", "-X"], "script", "train.py")
    assert without_option(["python", "-I", "-m", "pkg", "-I"], "I") == ["python", "-m", "pkg", "-I"]
