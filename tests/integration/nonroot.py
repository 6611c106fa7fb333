"""Run hostagent (or hostagentd) commands as another user (uid/gid 65534), each in a forked child of this
process: ``python nonroot.py ROOT [GID]`` (GID: its group instead) reads JSON argv lists on stdin, runs each with ROOT
put in for the word ``ROOT``, and prints one JSON line per command: [argv, exit code,
output]. A fork, not an exec: that user may not be able to read this interpreter, so
every module is imported here first, as root."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import signal
import sys
import traceback

NOBODY = 65534


# Standard modules hostagent imports late (often only on an error path).
STDLIB = ("argparse", "asyncio", "base64", "collections", "concurrent.futures", "contextlib", "ctypes",
          "dataclasses", "datetime", "difflib", "errno", "fcntl", "functools", "grp", "hashlib",
          "importlib.metadata", "ipaddress", "itertools", "json", "logging", "logging.handlers", "pwd",
          "queue", "random", "re", "secrets", "selectors", "shlex", "shutil", "signal", "socket", "stat",
          "statistics", "string", "struct", "subprocess", "tempfile", "textwrap", "threading", "time",
          "tomllib", "traceback", "typing", "urllib.parse", "uuid", "weakref", "zlib",
          "encodings.idna",    # the DRA plugin's HTTP client resolves the API server's name
          "jsonschema",        # and its own standard modules (pprint, ...): sharing validates with it
          "http.server", "prometheus_client")   # a daemon's metrics


def import_everything() -> None:
    for name in STDLIB:
        importlib.import_module(name)
    import hostagent
    for info in pkgutil.walk_packages(hostagent.__path__, "hostagent."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def run_as_nobody(argv: list[str], gid: int = NOBODY) -> tuple[int, str]:
    """``hostagent ARGV`` (the daemon's program with ARGS when ARGV is ``["daemon:", *ARGS]``)
    as nobody."""
    if argv[:1] == ["daemon:"]:
        from hostagent.daemon.main import main
        argv = argv[1:]
    else:
        from hostagent.cli.main import main
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(NOBODY)
            # A command that runs until stopped (health watch) is stopped as Ctrl-C would.
            signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
            signal.alarm(5)
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


def main() -> None:
    root = sys.argv[1]
    gid = int(sys.argv[2]) if len(sys.argv) > 2 else NOBODY
    import_everything()
    for line in sys.stdin:
        argv = [a.replace("ROOT", root) for a in json.loads(line)]
        code, out = run_as_nobody(argv, gid)
        print(json.dumps([argv, code, out]), flush=True)


if __name__ == "__main__":
    main()
