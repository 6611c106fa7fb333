"""The sh front of ``hostagent-runtime``: what container engines actually execute.

An engine calls its OCI runtime several times per container (create, start, state,
delete, ...). Starting Python for each costs ~40% of a trivial container's start, so the
front is a POSIX sh script that execs the low-level runtime itself unless the call is a
``create`` whose config.json mentions one of the request markers (a fixed-string grep).
Only then does it run the Python part, with ``-I -S`` and an explicit ``sys.path``:
``site`` processing (.pth files, editable-install finders) alone costs tens of
milliseconds, more than the shim's own work.

Everything the front needs is resolved when it is rendered (``install-shim``): the
low-level runtime, the interpreter, the import path and the markers. Re-run
``hostagent runtime install-shim`` after changing ``runtime.low_level_runtimes``,
``runtime.annotation_prefixes`` or ``runtime.accept_volume_mounts``, or after moving the
Python installation.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .requests import ENV_NAME, MARKER_DIR, VALUE_OPTIONS

__all__ = ["FrontSettings", "render_front", "front_settings", "DEFAULT_SHIM_PATH"]

DEFAULT_SHIM_PATH = "/usr/local/sbin/hostagent-runtime"


@dataclass(frozen=True)
class FrontSettings:
    runtime: str                 # absolute path of runc/crun
    python: str                  # absolute path of the interpreter
    sys_path: tuple[str, ...]    # where hostagent and its dependencies are importable
    grep: str                    # absolute path of grep
    markers: tuple[str, ...]     # fixed strings that may mean a request
    env_needs_privilege: bool    # NVIDIA_VISIBLE_DEVICES counts only with CAP_SYS_ADMIN
    config: str                  # the hostagent config file the shim reads
    cache_dir: str


def front_settings(runtime_config, *, runtime: str | None = None, config: str, cache_dir: str) -> FrontSettings:
    """Resolve everything the front needs from this installation and ``runtime_config``."""
    import os
    import shutil
    import sys
    from pathlib import Path

    import hostagent
    from ..errors import NotFoundError
    from .shim import find_runtime
    runtime = find_runtime([runtime] if runtime else runtime_config.low_level_runtimes)
    grep = shutil.which("grep")
    if not grep:
        raise NotFoundError("grep is not installed", hint="the shim's front uses it to look for GPU requests")
    # hostagent itself (an editable install is found by a meta-path hook, not sys.path), then
    # the package directories site set up for this interpreter (PyYAML, jsonschema, ...).
    paths = [str(Path(hostagent.__file__).resolve().parent.parent)]
    paths += [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    markers = list(runtime_config.annotation_prefixes)
    if runtime_config.accept_volume_mounts:
        markers.append(MARKER_DIR.rstrip("/").rsplit("/", 1)[1])   # nvidia-container-devices
    if runtime_config.accept_env_unprivileged:
        markers.append(f"{ENV_NAME}=")
    return FrontSettings(runtime=str(Path(runtime).resolve()), python=sys.executable,
                         sys_path=tuple(dict.fromkeys(paths)), grep=grep, markers=tuple(markers),
                         env_needs_privilege=not runtime_config.accept_env_unprivileged,
                         config=config, cache_dir=cache_dir)


def render_front(s: FrontSettings) -> str:
    q = shlex.quote
    bootstrap = (f"import sys; sys.path[:0] = {list(s.sys_path)!r}; "
                 "from hostagent.runtime.shim import main; main()")
    grep = q(s.grep)

    def grep_any(*patterns):
        return f'{grep} -qsF {" ".join(f"-e {q(p)}" for p in patterns)} -- "$config"'
    if s.env_needs_privilege:
        # CUDA images carry NVIDIA_VISIBLE_DEVICES=all; when only privileged containers may
        # use it, an unprivileged one with nothing else must not cost a Python start. The
        # test is (marker or env) and (marker or CAP_SYS_ADMIN): one grep for a container
        # that mentions neither, the common case.
        strict = f"{grep_any(*s.markers)} || " if s.markers else ""
        test = (f"{grep_any(*s.markers, ENV_NAME + '=')} &&\n"
                f"        {{ {strict}{grep_any('CAP_SYS_ADMIN')}; }}")
    else:
        test = grep_any(*s.markers) if s.markers else "false"
    value_opts = "|".join(sorted(VALUE_OPTIONS))
    return f"""#!/bin/sh
# hostagent-runtime: OCI runtime shim front, written by 'hostagent runtime install-shim'.
# Do not edit: re-run install-shim instead. Every call except a create whose config.json
# mentions a GPU request execs the low-level runtime directly, without starting Python.
RUNTIME={q(s.runtime)}
shim() {{
    exec {q(s.python)} -I -S -c {q(bootstrap)} \\
        --runtime "$RUNTIME" --config {q(s.config)} --cache-dir {q(s.cache_dir)} -- "$@"
}}
case ${{1-}} in
    --help|-h|--version|-v) shim "$@" ;;    # the shim says what it is, then the runtime answers
esac
cmd= bundle=. skip=
for arg do
    if [ -n "$skip" ]; then
        [ "$skip" = b ] && bundle=$arg
        skip=
        continue
    fi
    if [ -z "$cmd" ]; then
        case $arg in
            {value_opts}) skip=v ;;
            -*) ;;
            create) cmd=create ;;
            *) exec "$RUNTIME" "$@" ;;
        esac
    else
        case $arg in
            --bundle|-bundle|-b) skip=b ;;
            --bundle=*|-bundle=*|-b=*) bundle=${{arg#*=}} ;;
        esac
    fi
done
[ "$cmd" = create ] || exec "$RUNTIME" "$@"
config=$bundle/config.json
if {test}; then
    shim "$@"
fi
exec "$RUNTIME" "$@"
"""
