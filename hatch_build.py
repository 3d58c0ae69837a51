"""hatchling's build hook for trainmeter: compiles the agent's C hooks (``trainmeter_agent/_native.c``).

A wheel gets the compiled module and the interpreter's tag; an editable install (``pip install -e .``) gets it next to
the source, where the install's path finds it. Where it cannot be built (no C compiler or no Python headers, a
platform other than Linux, ``TM_BUILD_NATIVE=0``) the build goes on without it and says why on stderr: tm works the
same, with the agent's Python hooks (the run's ``probe.native`` fact says so, and ``tm doctor``).

The module carries the CRC-32 of the source it was built from: the agent uses it only where that matches the
``_native.c`` beside it, so a checkout whose C source changed since the last install runs the Python hooks rather
than stale C ones (``./scripts/setup`` builds it again).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import zlib

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("trainmeter_agent", "_native.c")


def source_crc(path: str) -> int:
    """The CRC-32 the agent compares (``trainmeter_agent._nativelane.load``)."""
    with open(path, "rb") as source:
        return zlib.crc32(source.read())


def compile_native(source: str, target: str) -> str | None:
    """Compile ``source`` into the extension module ``target``; None, or why it could not."""
    if os.environ.get("TM_BUILD_NATIVE") == "0":
        return "TM_BUILD_NATIVE=0"
    if not sys.platform.startswith("linux"):
        return f"the C hooks are built for Linux only, not {sys.platform}"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python.h in {include} (install the Python development headers, e.g. python3-dev)"
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    command = [
        *compiler,
        "-O2",
        "-fPIC",
        "-shared",
        "-Wall",
        f"-DTM_SOURCE_CRC={source_crc(source)}u",
        f"-I{include}",
        source,
        "-o",
        target,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{shlex.join(command)} did not run: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        errors = [line.strip() for line in lines if "error" in line] or lines[-3:]
        return f"{shlex.join(command)} failed (exit {done.returncode}): {' '.join(errors[:3])}"
    return None


class NativeHooks(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        source = os.path.join(self.root, SOURCE)
        name = "_native" + sysconfig.get_config_var("EXT_SUFFIX")
        in_place = os.path.join(self.root, "trainmeter_agent", name)
        if version == "editable":
            target = in_place
        else:
            target = os.path.join(tempfile.mkdtemp(prefix="tm-native-"), name)
        why = compile_native(source, target)
        if why is not None:
            if version == "editable" and os.path.exists(in_place):
                os.remove(in_place)  # an older build would not match the source any more
            sys.stderr.write(
                f"trainmeter: the agent's C hooks were not built ({why}); tm works the same with its Python "
                "hooks, which cost a tight training loop more per iteration\n"
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][target] = f"trainmeter_agent/{name}"
