"""mig-parted hooks files (``api/hooks/v1``): commands run at named points of an apply.

    version: v1
    hooks:
      pre-apply-mode:
        - command: /bin/bash
          args: ["-c", "systemctl stop kubelet"]
          envs: {KEY: value}
          workdir: /

As in mig-parted, a hook's environment is its ``envs`` plus the apply's flag variables
(``MIG_PARTED_SELECTED_CONFIG`` and friends), not the caller's environment; the command
is looked up on the caller's PATH; the first failing entry fails the hook. Unlike
mig-parted, an unknown hook name is an error rather than a hook that never runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from ..errors import ConfigError, HostagentError, StateError

__all__ = ["HOOK_NAMES", "HookSpec", "Hooks", "load_hooks", "parse_hooks", "NO_HOOKS", "flag_env", "around_apply"]

log = logging.getLogger(__name__)

HOOK_NAMES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
_FIELDS = ("command", "args", "envs", "workdir")


@dataclass(frozen=True)
class HookSpec:
    command: str
    args: tuple[str, ...] = ()
    envs: tuple[tuple[str, str], ...] = ()
    workdir: str = ""

    def run(self, env: dict[str, str], name: str) -> None:
        exe = shutil.which(self.command) or (self.command if os.sep in self.command else None)
        if exe is None:
            raise StateError(f"{name} hook: command not found: {self.command}")
        full_env = {**dict(self.envs), **env}    # the flag variables win, as in mig-parted
        if self.workdir and not os.path.isdir(self.workdir):
            raise StateError(f"{name} hook: its workdir {self.workdir} is not a directory "
                             f"({'it does not exist' if not os.path.lexists(self.workdir) else 'a file is there'})",
                             hint="create the folder or fix 'workdir' in the hooks file; "
                                  f"{self.command} was not run")
        try:
            done = subprocess.run([exe, *self.args], env=full_env, cwd=self.workdir or None,
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL)
        except OSError as e:
            # The folder can vanish between the check and the start: say which path failed.
            if self.workdir and e.filename == self.workdir:
                raise StateError(f"{name} hook: cannot enter its workdir {self.workdir}: {e.strerror}",
                                 hint=f"{self.command} was not run") from None
            raise StateError(f"{name} hook: cannot run {self.command}: {e.strerror}") from None
        for line in (done.stdout + done.stderr).splitlines():
            log.debug("%s hook: %s", name, line)
        if done.returncode != 0:
            last = next((ln for ln in reversed((done.stderr or done.stdout).splitlines()) if ln.strip()), "")
            raise StateError(f"{name} hook failed: {self.command} exited with status {done.returncode}"
                             + (f": {last.strip()}" if last else ""))


@dataclass(frozen=True)
class Hooks:
    hooks: dict[str, tuple[HookSpec, ...]] = field(default_factory=dict)
    source: str = ""

    def run(self, name: str, env: dict[str, str]) -> None:
        for spec in self.hooks.get(name, ()):
            spec.run(env, name)


NO_HOOKS = Hooks()


def flag_env(*, config_file: str | None = None, hooks_file: str | None = None,
             skip_reset: bool = False, mode_only: bool = False) -> dict[str, str]:
    """The apply's flags as mig-parted hands them to hooks (its CLI flags' variables; a
    file's is empty without one, as for inline documents). MIG_PARTED_SELECTED_CONFIG is
    added by whoever runs the hooks: the config's name is known once it is planned."""
    return {"MIG_PARTED_CONFIG_FILE": config_file or "", "MIG_PARTED_HOOKS_FILE": hooks_file or "",
            "MIG_PARTED_SKIP_RESET": str(skip_reset).lower(),
            "MIG_PARTED_MODE_CHANGE_ONLY": str(mode_only).lower()}


@contextlib.contextmanager
def around_apply(hooks: Hooks, env: dict[str, str]):
    """``apply-start`` before the block; ``apply-exit`` after it, always, as mig-parted's
    deferred one: its failure is reported only when nothing failed before it."""
    hooks.run("apply-start", env)
    failure = None
    try:
        yield
    except BaseException as e:
        failure = e
        raise
    finally:
        try:
            hooks.run("apply-exit", env)
        except HostagentError as e:
            if failure is None:
                raise
            log.error("%s", e.message)


def _spec(raw, where: str) -> HookSpec:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with 'command'")
    for key in raw:
        if key not in _FIELDS:
            raise ValueError(f"{where}: unexpected field: {key}")
    command = raw.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError(f"{where}: 'command' is required")
    args = raw.get("args") or []
    envs = raw.get("envs") or {}
    workdir = raw.get("workdir") or ""
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        raise ValueError(f"{where}: 'args' must be a list of strings")
    if not isinstance(envs, dict):
        raise ValueError(f"{where}: 'envs' must be a mapping")
    if not isinstance(workdir, str):
        raise ValueError(f"{where}: 'workdir' must be a string")
    return HookSpec(command, tuple(str(a) for a in args),
                    tuple((str(k), "" if v is None else str(v)) for k, v in envs.items()), workdir)


def parse_hooks(text: str | bytes, source: str = "<input>") -> Hooks:
    from .spec import decode_document
    doc = decode_document(text, source) or {}
    try:
        if not isinstance(doc, dict):
            raise ValueError("expected a mapping with 'version' and 'hooks'")
        for key in doc:
            if key not in ("version", "hooks"):
                raise ValueError(f"unexpected field: {key}")
        if doc.get("version", "v1") != "v1":
            raise ValueError(f"unknown version: {doc.get('version')}")
        raw = doc.get("hooks") or {}
        if not isinstance(raw, dict):
            raise ValueError("'hooks' must map hook names to lists of commands")
        hooks = {}
        for name, specs in raw.items():
            if name not in HOOK_NAMES:
                raise ValueError(f"unknown hook '{name}' (hooks are {', '.join(HOOK_NAMES)})")
            if not isinstance(specs, list):
                raise ValueError(f"hooks.{name}: expected a list of commands")
            hooks[name] = tuple(_spec(s, f"hooks.{name}[{i}]") for i, s in enumerate(specs))
    except ValueError as e:
        raise ConfigError(str(e), where=source) from None
    return Hooks(hooks, source)


def load_hooks(path: str) -> Hooks:
    from ..fileio import read_config_file
    return parse_hooks(read_config_file(path, "hooks file"), path)
