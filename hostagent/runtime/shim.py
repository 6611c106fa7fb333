"""``hostagent-runtime``, the Python part of the OCI runtime shim.

For ``create`` it applies the container's GPU requests (see ``requests``) as CDI edits to
``<bundle>/config.json``, atomically, then execs the low-level runtime; anything else is
exec'd unchanged. The sh front written by ``hostagent runtime install-shim`` (``front``)
runs this only for a create whose config.json could carry a request, so most runtime calls
never start Python.

    python3 -I -m hostagent.runtime.shim [--runtime PATH] [--config FILE] [--cache-dir DIR] -- ARGS...

Imports stay small: os, the C JSON codec (``ocijson``, not :mod:`json`, whose regular
expressions cost milliseconds) and the CDI modules on the hot path; PyYAML and jsonschema
only when the configuration changed since it was last validated.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["main", "prepare_bundle", "find_runtime"]

CACHE_DIR = "/run/hostagent"


def find_runtime(candidates) -> str:
    """The first of ``candidates`` (names in PATH or absolute paths) that is executable."""
    from ..errors import NotFoundError
    for name in candidates:
        if "/" in name:
            if os.access(name, os.X_OK):
                return name
            continue
        for d in os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").split(":"):
            path = os.path.join(d, name)
            if d and os.access(path, os.X_OK) and not os.path.isdir(path):
                return path
    raise NotFoundError(f"no low-level OCI runtime found among {', '.join(candidates)}",
                        hint="install runc or crun, or set runtime.low_level_runtimes")


def prepare_bundle(bundle: str, runtime_config, *, log=None) -> tuple:
    """Apply the GPU requests of ``bundle``'s config.json to it. Returns the Requests
    (empty: the file was left untouched)."""
    from ..cdi.cache import load_cache
    from ..cdi.inject import inject
    from ..errors import ConfigError
    from .ocijson import dumps, loads
    from .requests import gpu_requests
    path = os.path.join(bundle, "config.json")
    try:
        with open(path, "rb") as f:
            config = loads(f.read())
    except OSError as e:
        raise ConfigError(f"cannot read the container's config: {e.strerror}", where=path) from None
    except ValueError as e:
        raise ConfigError(f"the container's config is not valid JSON: {e}", where=path) from None
    requests = gpu_requests(config, runtime_config)
    if not requests:
        return requests
    cache = load_cache(runtime_config.cdi_spec_dirs)
    new = inject(config, cache, requests.devices, driver_only_kinds=requests.driver_only_kinds)
    from ..fileio import write_atomic
    write_atomic(path, dumps(new), os.stat(path).st_mode & 0o7777)
    if log:
        log(f"{path}: {requests.source}: applied {', '.join(requests.devices) or 'driver files only'}")
    return requests


def _runtime_log(argv: list[str], message: str) -> None:
    """Also put the error where containerd's runc shim looks for a runtime's last error
    (the --log file, in --log-format), so the engine's message names the device."""
    from .requests import VALUE_OPTIONS
    log, fmt, i = None, "text", 0
    while i < len(argv) and argv[i].startswith("-"):     # global options only
        arg, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith(("--log=", "--log-format=")):
            arg, value = arg.split("=", 1)
            i -= 1
        if arg == "--log":
            log = value
        elif arg == "--log-format":
            fmt = value
        i += 2 if arg in VALUE_OPTIONS else 1
    if not log:
        return
    from .ocijson import dumps
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = dumps({"level": "error", "msg": message, "time": stamp}) if fmt == "json" \
        else f"time={stamp!r} level=error msg={dumps(message)}"
    try:
        with open(log, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _file_logger(path):
    if not path:
        return None

    def log(message: str) -> None:
        try:
            with open(path, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} hostagent-runtime[{os.getpid()}]: {message}\n")
        except OSError:
            pass
    return log


def _options(argv: list[str]) -> tuple[dict, list[str]]:
    opts = {"runtime": None, "config": None, "cache_dir": CACHE_DIR}
    i = 0
    while i < len(argv) and argv[i] != "--":
        key = argv[i].lstrip("-").replace("-", "_")
        if key not in opts or not argv[i].startswith("--"):
            break                   # the low-level runtime's own arguments from here
        if i + 1 >= len(argv):
            print(f"hostagent-runtime: error: {argv[i]} needs a value (see hostagent-runtime --help)",
                  file=sys.stderr)
            sys.exit(2)
        opts[key] = argv[i + 1]
        i += 2
    if i < len(argv) and argv[i] == "--":
        i += 1
    return opts, argv[i:]


# Asked of the shim itself (by a person, or an engine's "runtime --version"): it says what it
# is, then the low-level runtime answers as usual.
_ABOUT = ("--help", "-h", "--version", "-v")


def _about(opts: dict, args: list[str]) -> None:
    """Answer --help or --version, then exec the low-level runtime with them (exit 0
    without one)."""
    from .. import __version__
    from ..errors import HostagentError
    try:
        runtime = opts["runtime"] or find_runtime(_runtime_config(opts).low_level_runtimes)
        name = runtime
    except HostagentError as e:
        runtime, name = None, f"the low-level runtime (none found here: {e.message})"
    if args[0] in ("--version", "-v"):
        print(f"hostagent-runtime version {__version__} (OCI runtime shim; runtime: {name})")
    else:
        print(f"hostagent-runtime {__version__}: the OCI runtime shim of hostagent. Container engines run it\n"
              "as a runtime ('hostagent runtime configure' adds it). At a container's create it applies the\n"
              "container's GPU requests (CDI device annotations, nvidia-container-devices mounts,\n"
              "NVIDIA_VISIBLE_DEVICES) from the node's CDI specs to its config.json; every call then goes\n"
              f"to {name}, unchanged. See hostagent's docs/runtime.md."
              + (f" {os.path.basename(runtime)}'s own help follows.\n" if runtime else ""))
    sys.stdout.flush()
    if runtime is None:
        sys.exit(0)
    try:
        os.execv(runtime, [os.path.basename(runtime), *args])
    except OSError as e:
        sys.exit(f"hostagent-runtime: {runtime}: {e.strerror}")


def _runtime_config(opts: dict):
    from ..config import load_config_cached
    return load_config_cached(opts["config"], opts["cache_dir"]).runtime


def main(argv: list[str] | None = None) -> None:
    from ..errors import HostagentError
    opts, args = _options(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in _ABOUT:
        _about(opts, args)
    try:
        from .requests import parse_call
        call = parse_call(args)
        config = None
        if call.command == "create" or not opts["runtime"]:
            config = _runtime_config(opts)
        runtime = opts["runtime"] or find_runtime(config.low_level_runtimes)
        if call.command == "create":
            log = _file_logger(config.log_file)
            try:
                prepare_bundle(call.bundle, config, log=log)
            except HostagentError as e:
                if log:
                    log(f"refused create: {e.message}")
                raise
    except HostagentError as e:
        message = f"hostagent-runtime: {e.message}"
        print(message, file=sys.stderr)
        _runtime_log(args, message)
        sys.exit(e.exit_code)
    os.execv(runtime, [os.path.basename(runtime), *args])


if __name__ == "__main__":
    main()
