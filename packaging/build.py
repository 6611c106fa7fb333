#!/usr/bin/env python3
"""Build hostagent's packages: one command per artifact, all from this checkout.

    python3 packaging/build.py deb   --output DIR   # hostagent_<version>-1_<arch>.deb (dpkg-buildpackage)
    python3 packaging/build.py rpm   --output DIR   # hostagent-<version>-1.<arch>.rpm (rpmbuild)
    python3 packaging/build.py image [--deb FILE] [--base IMAGE | --base-tarball TAR] [--output DIR]
    python3 packaging/build.py stage --dest DIR     # the installed tree both packages are made from
                                                    # (deb/rpm --stage DIR: package that tree)
    python3 packaging/build.py version

The version is hostagent's own (``hostagent.__version__``, which pyproject.toml reads):
the packages add only a release number, the image is tagged with it. See docs/install.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stage as staging  # noqa: E402

SRC = Path(__file__).resolve().parents[1]
PACKAGING = SRC / "packaging"
RELEASE = "1"
IMAGE = "localhost/hostagent"
BASE_IMAGE = "localhost/hostagent-base:bookworm"
# The distribution's interpreter of the builder's Python version: the environment's python.
DEFAULT_PYTHON = f"/usr/bin/python3.{sys.version_info.minor}"
COPY_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache",
                                     ".hypothesis", "debian", "venv", ".venv")


def version() -> str:
    text = (SRC / "hostagent/__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def source_date_epoch() -> str:
    """The last commit's time, for reproducible dates (changelog, man pages)."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        return os.environ["SOURCE_DATE_EPOCH"]
    try:
        return subprocess.run(["git", "-C", str(SRC), "log", "-1", "--format=%ct"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "0"


# The Debian package each tool comes from.
TOOL_PACKAGES = {"dpkg-buildpackage": "dpkg-dev", "dpkg-checkbuilddeps": "dpkg-dev", "dh": "debhelper",
                 "rpmbuild": "rpm"}


def need(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        packages = " ".join(dict.fromkeys(TOOL_PACKAGES.get(t, t) for t in missing))
        sys.exit(f"build.py: not installed: {', '.join(missing)} (on Debian: apt-get install {packages})")


def unmet_build_depends(control: Path) -> list[str]:
    """The Debian packages the deb's build needs and this machine lacks: its Build-Depends
    and build-essential, as dpkg-buildpackage checks them (dpkg-checkbuilddeps), but before
    anything is built. ``DPKG_ADMINDIR`` names another dpkg database, as for dpkg itself."""
    admindir = os.environ.get("DPKG_ADMINDIR")
    done = subprocess.run(["dpkg-checkbuilddeps", *([f"--admindir={admindir}"] if admindir else []), str(control)],
                          capture_output=True, text=True)
    if done.returncode == 0:
        return []
    unmet = re.search(r"Unmet build dependencies: (.*)", done.stderr)
    if not unmet:
        sys.exit(f"build.py: dpkg-checkbuilddeps failed: {done.stderr.strip() or done.returncode}")
    # "build-essential:native python3-pip (>= 20) a | b [amd64]": the first of each
    # alternative, by name.
    text = re.sub(r"\([^)]*\)|\[[^]]*\]|<[^>]*>", " ", unmet.group(1))
    names = [alternatives.split("|")[0].split(":")[0] for alternatives in re.sub(r"\s*\|\s*", "|", text).split()]
    return list(dict.fromkeys(names))


def snippets(text: str) -> str:
    """Maintainer script placeholders ``#HOSTAGENT:name#`` replaced by packaging/common/name.sh,
    so deb and rpm run the same shell."""
    return re.sub(r"^#HOSTAGENT:([a-z-]+)#$", lambda m: (PACKAGING / "common" / f"{m[1]}.sh").read_text().rstrip(),
                  text, flags=re.M)


def copy_source(work: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) in a fresh tree."""
    tree = work / f"hostagent-{version()}"
    if tree.exists():
        shutil.rmtree(tree)
    listed = subprocess.run(["git", "-C", str(SRC), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode != 0:                  # not a git checkout: a source tarball
        shutil.copytree(SRC, tree, ignore=COPY_IGNORE, symlinks=True)
        return tree
    for name in filter(None, listed.stdout.decode().split("\0")):
        source, target = SRC / name, tree / name
        if source.is_symlink() or source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return tree


def build_deb(output: Path, work: Path, stage: Path | None = None) -> Path:
    need("dpkg-buildpackage", "dh", "dpkg-checkbuilddeps")
    unmet = unmet_build_depends(PACKAGING / "deb/control")
    if unmet:
        sys.exit(f"build.py: the deb's build dependencies are not installed: {', '.join(unmet)} "
                 f"(on Debian: apt-get install {' '.join(unmet)})")
    tree = copy_source(work)
    debian = tree / "debian"
    shutil.copytree(PACKAGING / "deb", debian)
    for script in debian.glob("hostagent.*"):
        script.write_text(snippets(script.read_text()))
    epoch = source_date_epoch()
    date = subprocess.run(["date", "-R", "-u", "-d", f"@{epoch}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (debian / "changelog").write_text(
        f"hostagent ({version()}-{RELEASE}) unstable; urgency=medium\n\n"
        f"  * hostagent {version()}.\n\n -- hostagent maintainers <maintainers@hostagent.invalid>  {date}\n")
    env = {k: v for k, v in os.environ.items() if k != "HOSTAGENT_STAGE"}
    env.update({"SOURCE_DATE_EPOCH": epoch, **({"HOSTAGENT_STAGE": str(stage)} if stage else {})})
    staging.run(["dpkg-buildpackage", "-b", "-us", "-uc"], cwd=tree, env=env)
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    deb = work / f"hostagent_{version()}-{RELEASE}_{arch}.deb"
    output.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(deb, output))


def build_rpm(output: Path, work: Path, stage: Path | None = None) -> Path:
    need("rpmbuild")
    tree = copy_source(work)
    top = work / "rpmbuild"
    spec = top / "SPECS/hostagent.spec"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(snippets((PACKAGING / "rpm/hostagent.spec").read_text()))
    epoch = source_date_epoch()
    date = subprocess.run(["date", "-u", "-d", f"@{epoch}", "+%a %b %d %Y"], capture_output=True, text=True,
                          check=True).stdout.strip()
    defines = {"_topdir": top, "hostagent_version": version(), "hostagent_release": RELEASE,
               "hostagent_changelog_date": date, "hostagent_src": tree, "hostagent_python": DEFAULT_PYTHON,
               "hostagent_builder": sys.executable, **({"hostagent_stage": stage} if stage else {})}
    staging.run(["rpmbuild", "-bb", *[a for k, v in defines.items() for a in ("--define", f"{k} {v}")], spec],
                env={**os.environ, "SOURCE_DATE_EPOCH": epoch})
    rpm = next((top / "RPMS").glob(f"*/hostagent-{version()}-{RELEASE}.*.rpm"))
    output.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(rpm, output))


def build_base(tarball: Path | None, work: Path) -> str:
    """A Debian 12 base image from a root tarball: the one given, or one mmdebstrap makes."""
    if tarball is None:
        need("mmdebstrap")
        tarball = work / "base.tar"
        staging.run(["mmdebstrap", "--variant=minbase", "--include=python3", "bookworm", tarball])
    staging.run(["podman", "import", "--change", "CMD=/bin/bash", tarball, BASE_IMAGE], stdout=subprocess.DEVNULL)
    return BASE_IMAGE


def build_image(deb: Path | None, base: str | None, tarball: Path | None, output: Path | None, work: Path) -> str:
    need("podman")
    deb = deb or build_deb(work / "deb", work)
    base = base or build_base(tarball, work)
    context = work / "image"
    if context.exists():
        shutil.rmtree(context)
    context.mkdir()
    shutil.copy2(deb, context / deb.name)
    tag = f"{IMAGE}:{version()}"
    staging.run(["podman", "build", "--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit",
                 "nproc=1024:1024", "--build-arg", f"BASE={base}", "--build-arg", f"VERSION={version()}",
                 "-f", PACKAGING / "container/Containerfile", "-t", tag, context])
    if output:
        output.mkdir(parents=True, exist_ok=True)
        staging.run(["podman", "save", "--format", "oci-archive", "-o",
                     output / f"hostagent_{version()}_{platform.machine()}.oci.tar", tag])
    return tag


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="build.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("deb", "rpm"):
        p = sub.add_parser(name, help=f"build the {name} package")
        p.add_argument("--output", type=Path, required=True, help="where the package goes")
        p.add_argument("--stage", type=Path, help="package this tree that 'stage' made (default: stage one)")
    p = sub.add_parser("image", help="build the container image from the deb")
    p.add_argument("--deb", type=Path, help="an already built deb (default: build one)")
    base = p.add_mutually_exclusive_group()
    base.add_argument("--base", help="base image (default: a Debian 12 made by mmdebstrap)")
    base.add_argument("--base-tarball", type=Path, help="a Debian 12 root tarball to import as the base")
    p.add_argument("--output", type=Path, help="also save the image here as an OCI archive")
    p = sub.add_parser("stage", help="install the package tree into DEST (what deb and rpm run)")
    p.add_argument("--dest", type=Path, required=True)
    p.add_argument("--python", default=DEFAULT_PYTHON,
                   help="the interpreter the environment is built for (default: %(default)s)")
    p.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    sub.add_parser("version", help="print the version")
    for p in sub.choices.values():
        if p.prog.endswith(("deb", "rpm", "image")):
            p.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.what == "version":
        print(version())
        return 0
    with tempfile.TemporaryDirectory(prefix="hostagent-build-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        if args.what == "stage":
            os.environ.setdefault("SOURCE_DATE_EPOCH", source_date_epoch())
            staging.stage(SRC, args.dest.resolve(), args.python, version(), work)
        elif args.what in ("deb", "rpm"):
            build = build_deb if args.what == "deb" else build_rpm
            print(build(args.output.resolve(), work, args.stage and args.stage.resolve()))
        else:
            print(build_image(args.deb and args.deb.resolve(), args.base,
                              args.base_tarball and args.base_tarball.resolve(),
                              args.output and args.output.resolve(), work))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as e:      # its own output, above, says why
        cmd = " ".join(map(str, e.cmd))
        sys.exit(f"build.py: {cmd[:200]} failed (exit {e.returncode}): its output above says why")
