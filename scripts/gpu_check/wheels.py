"""The wheels gpu-check carries to a GPU machine that has no package registry: trainmeter's, pyzmq's and msgspec's.

Run on a machine with the repository (and, for ``--download``, a registry). It never installs anything into the
interpreter running it. The GPU machine is assumed to hold torch, aiohttp, pluggy and nvidia-ml-py already (its
training environment); ``--all`` adds those too, for a machine that lacks them.

  python scripts/gpu_check/wheels.py DIR --download [--python-version 3.12] [--platform manylinux_2_28_x86_64]
  python scripts/gpu_check/wheels.py DIR --from-installed    # this interpreter's pyzmq and msgspec, repacked

``--from-installed`` fits a GPU machine with this machine's Python version and platform (and CI, which has no
registry while it tests): each installed distribution's files, as its RECORD lists them, go back into a wheel.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: What tm needs beside torch on the GPU machine, always carried.
CARRIED = ("pyzmq", "msgspec")
#: What a training environment usually has already; carried with --all.
USUALLY_THERE = ("pluggy", "aiohttp", "nvidia-ml-py")


def build_trainmeter(out: Path) -> Path:
    """trainmeter's own wheel, built from this checkout (hatchling, no build isolation: no registry needed)."""
    before = set(out.glob("trainmeter-*.whl"))
    for old in before:
        old.unlink()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
    )
    (built,) = out.glob("trainmeter-*.whl")
    return built


def download(out: Path, names: list[str], python_version: str, platforms: list[str]) -> None:
    """Binary wheels of ``names`` for another interpreter, from the registry (their dependencies too)."""
    digits = python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "-q", "-d", str(out), "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", "--abi", f"cp{digits}"]
    for platform in platforms:
        command += ["--platform", platform]
    subprocess.run([*command, *names], check=True)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(name: str, out: Path) -> Path:
    """A wheel of the installed distribution ``name``, rebuilt from the files its RECORD lists (bytecode left out)."""
    dist = importlib.metadata.distribution(name)
    root = Path(dist.locate_file("")).resolve()
    info = next(p for p in (dist.files or []) if p.parts[0].endswith(".dist-info"))
    info_dir = info.parts[0]
    tags = [
        line.split(":", 1)[1].strip()
        for line in (root / info_dir / "WHEEL").read_text().splitlines()
        if line.startswith("Tag:")
    ]
    if not tags:
        raise SystemExit(f"{name}: its WHEEL file names no tag; install it from a wheel first")
    normalized = dist.metadata["Name"].replace("-", "_")
    target = out / f"{normalized}-{dist.version}-{tags[0]}.whl"
    record: list[str] = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for file in dist.files or []:
            path = (root / file).resolve()
            relative = file.as_posix()
            if relative.startswith("..") or "__pycache__" in file.parts or file.suffix == ".pyc":
                continue  # scripts outside site-packages, and bytecode the installer writes again
            if file.parent.name == info_dir and file.name in (
                "RECORD",
                "INSTALLER",
                "REQUESTED",
                "direct_url.json",
            ):
                continue  # written by the installer, not part of a wheel (RECORD is rebuilt below)
            if not path.is_file():
                continue
            data = path.read_bytes()
            wheel.writestr(relative, data)
            record.append(f"{relative},{_digest(data)},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        wheel.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("out", type=Path, help="the wheels folder to fill (made if needed)")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--download", action="store_true", help="from the registry, for --python-version/--platform"
    )
    how.add_argument("--from-installed", action="store_true", help="repack this interpreter's installed ones")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument(
        "--platform",
        action="append",
        help="wheel platform tags (default manylinux_2_28, _2_17 and 2014 for x86_64; repeat the flag)",
    )
    parser.add_argument("--all", action="store_true", help="also pluggy, aiohttp and nvidia-ml-py")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = list(CARRIED) + (list(USUALLY_THERE) if args.all else [])
    built = build_trainmeter(args.out)
    print(f"wheels: {built.name}")
    if args.download:
        platforms = args.platform or [
            "manylinux_2_28_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
        ]
        download(args.out, names, args.python_version, platforms)
    else:
        missing = []
        for name in names:
            try:
                print(f"wheels: {repack(name, args.out).name} (repacked from {sys.executable})")
            except importlib.metadata.PackageNotFoundError:
                missing.append(name)
        if missing:
            print(f"wheels: not installed here, so not repacked: {', '.join(missing)}", file=sys.stderr)
            return 1
    print(f"wheels: {len(list(args.out.glob('*.whl')))} in {os.path.abspath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
