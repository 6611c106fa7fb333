"""Entry point of the hook program: ``python3 -I -S -c ...`` as specs run it, or
``python3 -I -m hostagent.hooks VERB ...`` by hand. Refuses to run without ``-I``.

Runs as host root at every container start, on a container root the image controls.
Order matters: trusted working directory and environment check first, then everything is
read and checked (arguments, OCI state, bundle, container root, host ldconfig) before
the first write, so a broken call fails with one line and changes nothing.
"""

import posix
import sys

from . import cli
from .errors import HookError, UsageError

# Variables the dynamic loader (or libc) acts on. They are read when the interpreter
# starts, so they cannot be cleaned up from here; but extension modules this program loads
# later (ctypes pulls in libffi) would still be found through them. Their presence means
# the engine passed the container's environment: refuse before loading anything.
_LOADER_VARS = ("GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH")


def main(argv: list[str] | None = None) -> int:
    """The program (``argv`` None: it exits here) or one call of it (returns the code)."""
    code = _main(argv)
    if argv is None:
        # Nothing is left to clean up (every descriptor is closed): skip the interpreter's
        # teardown of its modules, a millisecond or two at every container start.
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        posix._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    posix.chdir("/")                    # never the container rootfs the engine may leave us in
    posix.umask(0o022)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv in (["--version"], ["-V"]):
        from .. import __version__
        print(f"{cli.PROG} {__version__}")
        return 0
    try:
        if argv in (["--help"], ["-h"]):
            # Answered even when not isolated (a console script cannot be): it reads and
            # writes nothing but this text.
            print(cli.USAGE)
            return 0
        _check_environment()
        req = cli.parse(argv)
        for message in req.warnings:
            warn(message)
        if req.help:
            print(cli.USAGE)
            return 0
        if req.from_spec:
            from .nodespec import hook_args
            for message in cli.add_spec_work(req, hook_args(req.from_spec)):
                warn(message)
        if req.verb is None:
            if not req.warnings:
                warn("no verb given; nothing to do (see --help)")
            return 0
        _run(req)
        return 0
    except HookError as e:
        # A flag used wrongly says where the flags are listed, as the other programs do.
        usage = f" (see {cli.PROG} --help)" if isinstance(e, UsageError) else ""
        print(f"{cli.PROG}: error: {e}{usage}", file=sys.stderr)
        return e.code
    except OSError as e:                 # anything not foreseen above: still one line, no traceback
        print(f"{cli.PROG}: error: {e}", file=sys.stderr)
        return 1


def warn(message: str) -> None:
    print(f"{cli.PROG}: warning: {message}", file=sys.stderr)


def _check_environment() -> None:
    if not sys.flags.isolated:
        # Without -I the interpreter has already honoured PYTHONPATH, PYTHONHOME and the
        # working directory before this line ran; refusing is all that is left. A console
        # script cannot be isolated (installers rewrite its "#!python" line without flags).
        raise HookError("not started isolated (python3 -I): the container's PYTHON* variables and working "
                        "directory could reach the hook. Run it with the command line 'hostagent cdi generate' "
                        "writes (python3 -I -S -c ...), or by hand as python3 -I -m hostagent.hooks")
    names = [k.decode("utf-8", "surrogateescape") for k in posix.environ]
    bad = [k for k in names if k.startswith("LD_") or k in _LOADER_VARS]
    if bad:
        raise HookError(f"refusing to run with {', '.join(sorted(bad))} set: the container's environment "
                        "reached the hook. Give the hook an explicit env (PATH only) and run it as python3 -I")


def _run(req: cli.Request) -> None:
    from . import ocistate
    from .inroot import Root

    state = ocistate.read_state(0)
    root_path, config = ocistate.read_bundle(state)
    links = list(req.links)
    if req.device_links:
        from .links import present_device_links
        links += present_device_links(req.device_links, ocistate.device_paths(config))
    wants_links = req.verb in ("prepare", "create-symlinks") and links
    wants_cache = req.verb == "update-ldcache" or (req.verb == "prepare" and req.folders)
    ldconfig = None
    with Root(root_path, bundle=state.get("bundle")) as root:
        try:
            if wants_cache:
                # Checked even where the cache is then made without it: a wrong
                # --ldconfig-path fails every start alike, not only on some images.
                from . import hostbin
                ldconfig = hostbin.open_ldconfig(req.ldconfig_path)
                if req.folders:
                    from . import ldcache
                    ldcache.check(root)
            # Everything is checked: from here on the container root is written (links
            # first reach every parent directory, then write).
            if wants_links:
                from .links import create_links
                create_links(root, links, warn)
            if wants_cache:
                from .ldcache import update
                update(root, req.folders, ldconfig, req.ldconfig_timeout)
        finally:
            if ldconfig is not None:
                posix.close(ldconfig)
