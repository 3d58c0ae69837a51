"""Reads device spec files: the built-in ones shipped in ``specs/`` and any a plugin adds.

It only reads and validates (``hardware.parse_spec`` holds the rules); it must never skip a bad file or let a plugin
silently replace a built-in spec, because a wrong spec means a wrong MFU.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable
from pathlib import Path

import msgspec

from trainmeter_core.model.device_specs import DeviceSpec, SpecError, parse_spec

__all__ = ["builtin_spec_dir", "load_spec_file", "load_specs"]


def builtin_spec_dir() -> Path:
    """Where the built-in spec files are: inside the installed package, else the repository's ``specs/``."""
    try:
        packaged = importlib.resources.files("trainmeter_core") / "specs"
        # The wheel carries the specs as package data; a plain install is a real folder on disk.
        if packaged.is_dir():
            return Path(str(packaged))
    except (ModuleNotFoundError, TypeError, NotImplementedError):
        pass
    return Path(__file__).resolve().parents[2] / "specs"


def load_spec_file(path: Path | str) -> DeviceSpec:
    """Read and validate one spec file; raise :class:`SpecError` naming the file when it is unreadable or invalid."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(str(path), f"cannot be read: {exc.strerror or exc}") from None
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise SpecError(str(path), f"is not valid JSON: {exc}") from None
    return parse_spec(data, str(path))


def load_specs(extra_paths: Iterable[Path | str] = ()) -> list[DeviceSpec]:
    """The built-in specs, then those in ``extra_paths`` (files, or folders of ``*.json``), all validated.

    Ids are unique: a later file reusing an id (a plugin's, say) is an error naming both files, never an override.
    """
    files = _spec_files(builtin_spec_dir())
    for extra in extra_paths:
        files.extend(_spec_files(Path(extra)))
    specs: list[DeviceSpec] = []
    origin_by_id: dict[str, str] = {}
    for path in files:
        spec = load_spec_file(path)
        if spec.id in origin_by_id:
            raise SpecError(
                spec.origin,
                f"spec id {spec.id!r} is already defined by {origin_by_id[spec.id]}; give this spec another id",
            )
        origin_by_id[spec.id] = spec.origin
        specs.append(spec)
    return specs


def _spec_files(path: Path) -> list[Path]:
    if path.is_dir():
        # Sorted so that which file "comes later" in a duplicate-id error does not depend on the filesystem.
        return sorted(p for p in path.glob("*.json") if p.is_file())
    if path.is_file():
        return [path]
    raise SpecError(str(path), "no such spec file or folder")
