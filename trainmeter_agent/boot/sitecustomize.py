"""trainmeter's bootstrap, put first on PYTHONPATH by ``tm``: starts the agent in a training process, then runs the
``sitecustomize`` this interpreter would have run without tm.

It must stay tiny, import nothing heavy (no zmq, msgspec or torch) and never raise: whether to stay dormant (in
multiprocessing helpers, compile workers, the torchrun parent) is decided from the command line alone.
"""

import os
import sys

# Commands that run helpers of the training process, never the training loop itself. ``-c`` code is matched by a
# fragment, ``-m`` modules and script paths by prefix or suffix.
_HELPER_CODE_FRAGMENTS = (
    "multiprocessing.spawn import spawn_main",  # spawn children, DataLoader workers under spawn
    "multiprocessing.forkserver import main",  # the forkserver (its forks inherit its dormancy)
    "multiprocessing.resource_tracker",
    "multiprocessing.semaphore_tracker",
)
_HELPER_MODULES = ("torch._inductor.compile_worker", "torch.distributed.run", "torch.distributed.launch")
_HELPER_SCRIPT_SUFFIXES = (
    "/torch/_inductor/compile_worker/__main__.py",
    "/torch/distributed/run.py",
    "/torch/distributed/launch.py",
    "/torchrun",
)


def _program(argv):
    """(how, what) of an interpreter command line: ("-c", code), ("-m", module), ("script", path) or ("", "")."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return ("script", argv[i + 1] if arg == "--" and i + 1 < len(argv) else arg)
        if arg.startswith("--"):  # --check-hash-based-pycs takes a value; other long options do not
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for at, letter in enumerate(arg[1:], start=1):
            if letter in "cm":
                value = arg[at + 1 :] or (argv[i + 1] if i + 1 < len(argv) else "")
                return ("-" + letter, value)
            if letter in "WX":  # an option with a value, attached (-Wignore) or next (-W ignore)
                i += 0 if arg[at + 1 :] else 1
                break
        i += 1
    return ("", "")


def dormant_reason(argv):
    """Why a process started with ``argv`` (``sys.orig_argv``) must not run the agent, or None for a trainer."""
    if "--multiprocessing-fork" in argv:
        return "multiprocessing child"
    how, what = _program(argv)
    if how == "-c":
        for fragment in _HELPER_CODE_FRAGMENTS:
            if fragment in what:
                return "multiprocessing helper"
    elif how == "-m":
        for module in _HELPER_MODULES:
            if what == module or what.startswith(module + "."):
                return "helper module " + module
    elif how == "script":
        path = what.replace(os.sep, "/")
        for suffix in _HELPER_SCRIPT_SUFFIXES:
            if path.endswith(suffix) or "/" + path == suffix:
                return "helper script " + suffix.rsplit("/", 1)[-1]
    return None


def _say(message):
    try:
        sys.stderr.write("tm: " + " ".join(str(message).split()) + "\n")
    except Exception:
        pass


def _importable(name):
    """Whether a top-level module can be found, as importlib.util.find_spec says (without its import cost)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is not None and find(name, None) is not None:
            return True
    return False


def _start_agent():
    if os.environ.get("TM_AGENT") != "1" or not os.environ.get("TM_AGENT_ENDPOINT"):
        return
    try:
        argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
        if dormant_reason(argv) is not None:
            return
        # A training command run by another interpreter (another venv) may not have trainmeter: stay out quietly.
        if not _importable("trainmeter_agent"):
            return
        import trainmeter_agent

        trainmeter_agent._start()
    except Exception as exc:
        _say(f"agent stopped: {type(exc).__name__}: {exc}")
        package = sys.modules.get("trainmeter_agent")
        if package is not None:
            package._disabled = True


def _is_boot_folder(entry, here):
    real = os.path.realpath(entry or os.getcwd())
    # Any trainmeter boot folder, not only ours: a second copy would start a second agent.
    return real == here or real.replace(os.sep, "/").endswith("/trainmeter_agent/boot")


def _chain():
    """Run the next ``sitecustomize`` on sys.path, under that name, as Python would have without tm."""
    try:
        import importlib.machinery

        here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
        others = [entry for entry in sys.path if isinstance(entry, str) and not _is_boot_folder(entry, here)]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
        if spec is None or spec.loader is None:
            return
        import importlib.util  # only when there is one to run: it costs about 3 ms

        module = importlib.util.module_from_spec(spec)
    except Exception as exc:
        _say(f"could not look for another sitecustomize: {type(exc).__name__}: {exc}")
        return
    sys.modules["sitecustomize"] = module
    # Its own errors are not ours: they reach site.py, which reports them exactly as it would without tm.
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    _start_agent()
    _chain()
