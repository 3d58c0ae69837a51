"""The built-in tracker taps (wandb, TensorBoard, tensorboardX, MLflow): plugins of the ``trainmeter_trackers`` hook in
the ``trainmeter.agent`` entry point group, registered exactly as a third-party tap would be.

A tap wraps one logging call of its library and hands the numbers it logged to ``emit``. It never imports its
library (``attach`` gets the module the user imported), reads numbers and 0-dim CPU tensors only (``emit`` checks),
ignores the library's calls to itself, and disables only itself on failure. Each tap follows
``trainmeter_core.api.TrackerTap``; the hook marker is the core's dependency-free ``hookimpl`` (the one every plugin
uses), so nothing here imports pluggy.
"""

from __future__ import annotations

import sys

from trainmeter_core import hookimpl

#: Non-zero while a tapped call runs: a tracker calling another tapped function inside is not logged twice.
_INSIDE = [0]


def wrap_logging_call(original, emit, read):
    """``original`` with the tap after it: ``read(args, kwargs) -> (values, step)`` runs once the call returned."""

    def tapped(*args, **kwargs):
        if _INSIDE[0]:
            return original(*args, **kwargs)
        _INSIDE[0] += 1
        try:
            result = original(*args, **kwargs)
        finally:
            _INSIDE[0] -= 1
        if emit.on:
            try:
                values, step = read(args, kwargs)
                if values:
                    emit(values, step)
            except Exception as exc:
                emit.stop(exc)
        return result

    tapped.__wrapped__ = original
    tapped._tm_wrapped = True
    for attr in ("__name__", "__qualname__", "__doc__"):
        try:
            setattr(tapped, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    return tapped


def _replace(owner, name: str, emit, read) -> bool:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_tm_wrapped", False):
        return False
    setattr(owner, name, wrap_logging_call(original, emit, read))
    return True


def _argument(args, kwargs, index: int, name: str, default=None):
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _flatten(data, prefix: str = "") -> dict:
    """A wandb-style nested dict as flat keys joined with '/' (the values are checked by emit)."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


class Tap:
    """One tracker tap (``trainmeter_core.api.TrackerTap``): ``name`` (the metric records' origin), ``module`` (whose
    import attaches it), ``attach(module, emit)``."""

    name = ""
    module = ""

    def attach(self, module, emit) -> None:
        raise NotImplementedError


class WandbTap(Tap):
    name = "wandb"
    module = "wandb"

    def attach(self, module, emit) -> None:
        run_module = sys.modules.get("wandb.sdk.wandb_run")
        run_class = getattr(run_module, "Run", None) or getattr(module, "Run", None)
        if run_class is None:
            raise RuntimeError("wandb has no Run class to tap")

        def read(args, kwargs):  # Run.log(self, data, step=None, commit=None)
            data = _argument(args, kwargs, 1, "data")
            return (_flatten(data) if isinstance(data, dict) else {}), _argument(args, kwargs, 2, "step")

        _replace(run_class, "log", emit, read)


class _SummaryWriterTap(Tap):
    def attach(self, module, emit) -> None:
        writer = getattr(module, "SummaryWriter", None)
        if writer is None:
            raise RuntimeError(f"{self.module} has no SummaryWriter to tap")

        def scalar(args, kwargs):  # add_scalar(self, tag, scalar_value, global_step=None, ...)
            tag = _argument(args, kwargs, 1, "tag")
            return {str(tag): _argument(args, kwargs, 2, "scalar_value")}, _argument(
                args, kwargs, 3, "global_step"
            )

        def scalars(args, kwargs):  # add_scalars(self, main_tag, tag_scalar_dict, global_step=None, ...)
            main = _argument(args, kwargs, 1, "main_tag")
            values = _argument(args, kwargs, 2, "tag_scalar_dict") or {}
            step = _argument(args, kwargs, 3, "global_step")
            return {f"{main}/{key}": value for key, value in values.items()}, step

        _replace(writer, "add_scalar", emit, scalar)
        _replace(writer, "add_scalars", emit, scalars)


class TensorBoardTap(_SummaryWriterTap):
    name = "tensorboard"
    module = "torch.utils.tensorboard"


class TensorBoardXTap(_SummaryWriterTap):
    name = "tensorboardx"
    module = "tensorboardX"


class MlflowTap(Tap):
    name = "mlflow"
    module = "mlflow"

    def attach(self, module, emit) -> None:
        def metric(args, kwargs):  # log_metric(key, value, step=None, ...)
            key = _argument(args, kwargs, 0, "key")
            return {str(key): _argument(args, kwargs, 1, "value")}, _argument(args, kwargs, 2, "step")

        def metrics(args, kwargs):  # log_metrics(metrics, step=None, ...)
            values = _argument(args, kwargs, 0, "metrics") or {}
            return {str(k): v for k, v in values.items()}, _argument(args, kwargs, 1, "step")

        fluent = sys.modules.get("mlflow.tracking.fluent")
        for name, read in (("log_metric", metric), ("log_metrics", metrics)):
            top = getattr(module, name, None)
            inner = getattr(fluent, name, None) if fluent is not None else None
            if inner is not None:
                _replace(fluent, name, emit, read)
            if top is not None and top is inner:
                setattr(module, name, getattr(fluent, name))  # `mlflow.log_metric` is the fluent function
            elif top is not None:
                _replace(module, name, emit, read)


class TrackerPlugin:
    """An entry point object of the ``trainmeter.agent`` group that provides one tap."""

    def __init__(self, tap: Tap) -> None:
        self.tap = tap

    @hookimpl
    def trainmeter_trackers(self) -> list[Tap]:
        return [self.tap]


wandb = TrackerPlugin(WandbTap())
tensorboard = TrackerPlugin(TensorBoardTap())
tensorboardx = TrackerPlugin(TensorBoardXTap())
mlflow = TrackerPlugin(MlflowTap())

#: The entry points of this package, as pyproject.toml registers them (used when no plugin list is at hand).
BUILTIN = {
    "wandb": "trainmeter_agent.taps:wandb",
    "tensorboard": "trainmeter_agent.taps:tensorboard",
    "tensorboardx": "trainmeter_agent.taps:tensorboardx",
    "mlflow": "trainmeter_agent.taps:mlflow",
}
