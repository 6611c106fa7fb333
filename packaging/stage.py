"""The installed tree every package is made from: hostagent in its own environment under
``/opt/hostagent``, built against the distribution's ``python3.X``, plus the files a host
needs around it. ``deb`` and ``rpm`` both install exactly this tree.

    DEST/opt/hostagent/                  venv: hostagent and its pinned dependencies
    DEST/usr/bin/<program>               -> /opt/hostagent/bin/<program>, every [project.scripts] entry
    DEST/lib/systemd/system/             the units in systemd/, run from /usr/bin
    DEST/etc/hostagent/config.yaml       every key, commented out, with its default
    DEST/usr/share/containers/oci/hooks.d/   the OCI hooks in hooks/
    DEST/usr/share/doc/hostagent/        README.md, docs/*.md and the Grafana dashboard
    DEST/usr/share/man/man{1,8}/         one page per program (hostagent's covers every command)
    DEST/usr/share/bash-completion/completions/

The environment is made where it will not run (DEST), so the paths it records are fixed
afterwards: script ``#!`` lines, byte code file names; files that only name the build
folder (activate scripts, pip's direct_url.json) are dropped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

__all__ = ["stage", "PREFIX", "UNIT_SUFFIXES"]

PREFIX = "/opt/hostagent"
HERE = Path(__file__).resolve().parent
UNIT_SUFFIXES = (".service", ".socket", ".path", ".timer", ".target")
# Programs the engines and systemd start; the rest are admins' commands (section 1).
MAN_SECTION_8 = ("hostagentd", "hostagent-hook", "hostagent-runtime")


def run(cmd: list, **kw) -> None:
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    start = time.monotonic()
    subprocess.run([str(c) for c in cmd], check=True, **kw)
    print(f"  ({time.monotonic() - start:.1f} s)", file=sys.stderr, flush=True)


def scripts(src: Path) -> dict[str, str]:
    """The installed programs: ``[project.scripts]`` of pyproject.toml."""
    with open(src / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def pip(*args) -> list:
    """pip of the interpreter running the build; it installs into other environments with
    --python (pip 22.3 and later)."""
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def builds_wheels() -> bool:
    """Whether this interpreter can build hostagent's wheel itself: setuptools 61 or later,
    with bdist_wheel (setuptools 70.1 and later, or the wheel package)."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2])
    return version >= (70, 1) or (version >= (61,) and importlib.util.find_spec("wheel") is not None)


def make_venv(src: Path, venv: Path, python: str, work: Path) -> None:
    # hostagent's wheel, with the builder's setuptools where it can (no isolated build
    # environment to set up each time), then it and its pinned dependencies into the venv.
    wheels = work / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    run(pip("wheel", "--quiet", "--no-deps", *(("--no-build-isolation",) if builds_wheels() else ()),
            "--wheel-dir", wheels, src))
    run([python, "-m", "venv", "--without-pip", venv])
    run(pip("--python", venv / "bin/python", "install", "--no-compile", "--no-warn-script-location",
            "--constraint", HERE / "constraints.txt", *wheels.glob("hostagent-*.whl")))
    cfg = venv / "pyvenv.cfg"
    cfg.write_text("".join(line for line in cfg.read_text().splitlines(True) if not line.startswith("command =")))
    for leftover in venv.glob("bin/[Aa]ctivate*"):
        leftover.unlink()
    for record in venv.glob("lib/python3*/site-packages/*.dist-info/direct_url.json"):
        record.unlink()
    # Modes as dh_fixperms would leave them (rpm has nothing like it): some wheels (protobuf)
    # ship their modules executable.
    for path in (venv / "lib").rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.name.endswith(".so") and ".so." not in path.name:
            path.chmod(0o644)
    shebang = f"#!{venv}/bin/python".encode()
    for script in (venv / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if data.startswith(shebang + b"\n"):
                # -I: no PYTHON* variables or user site for programs that run as root (the
                # hook refuses to run without it).
                script.write_bytes(f"#!{PREFIX}/bin/python -I".encode() + data[len(shebang):])


def byte_compile(dest: Path, venv: Path) -> None:
    """Byte code for the installed paths; unchecked-hash: only the package manager changes
    these files, always together with their byte code, so no start pays for a check."""
    run([venv / "bin/python", "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
         "-s", dest, "-p", "/", venv / "lib"], stdout=subprocess.DEVNULL)


def install_file(source: Path, target: Path, mode: int = 0o644, text: str | None = None) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        shutil.copyfile(source, target)
    else:
        target.write_text(text)
    target.chmod(mode)


def host_files(src: Path, dest: Path) -> None:
    for name in scripts(src):
        link = dest / "usr/bin" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(f"{PREFIX}/bin/{name}")
    # Units name pip's /usr/local/bin (docs/daemon.md); the package puts programs in /usr/bin.
    for unit in sorted((src / "systemd").iterdir()):
        if unit.suffix in UNIT_SUFFIXES:
            install_file(unit, dest / "lib/systemd/system" / unit.name,
                         text=unit.read_text().replace("/usr/local/bin/", "/usr/bin/"))
    for hook in sorted((src / "hooks").glob("*.json")):
        install_file(hook, dest / "usr/share/containers/oci/hooks.d" / hook.name)
    doc = dest / "usr/share/doc/hostagent"
    dashboards = sorted((src / "packaging/grafana").glob("*.json"))
    for page in [src / "README.md", *sorted((src / "docs").glob("*.md")), *dashboards]:
        install_file(page, doc / page.name)


def generated_files(dest: Path, venv: Path, version: str, tools: Path, src: Path) -> None:
    """Man pages, completion and the commented configuration, from the installed package's
    own parsers and schema (docgen runs inside the new environment)."""
    run(pip("install", "--quiet", "--target", tools, "--requirement", HERE / "build-requirements.txt"))
    run([venv / "bin/python", "-I", "-B", HERE / "docgen.py", "--tools", tools, "--dest", dest, "--version", version,
         "--section-8", ",".join(MAN_SECTION_8), *[f"--program={p}={ep}" for p, ep in scripts(src).items()]])


def stage(src: Path, dest: Path, python: str, version: str, work: Path) -> None:
    """Install everything into ``dest``; ``work`` is a scratch folder."""
    venv = dest / PREFIX.lstrip("/")
    if venv.exists():
        shutil.rmtree(venv)
    make_venv(src, venv, python, work)
    host_files(src, dest)
    generated_files(dest, venv, version, work / "tools", src)
    byte_compile(dest, venv)
    os.chmod(dest / "etc/hostagent/config.yaml", 0o644)
