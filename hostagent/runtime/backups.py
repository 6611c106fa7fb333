"""What ``runtime revert`` restores: every file as it was before hostagent first changed it.

One folder per engine (``/var/lib/hostagent/runtime-backups/<engine>``) holds, for each
file any ``configure`` wrote, its original content (``<i>.orig``; none when hostagent
created the file) and the hash of every text hostagent wrote to it, plus the folders
hostagent created. A later ``configure`` of the same file keeps the original and only
adds the hash of its new text, so any sequence of configures (other flags, another
``--config``, with and without a drop-in) is undone by one revert. A file changed by
someone else since hostagent wrote it is kept as ``<i>.replaced-<n>`` when configure
replaces it again (revert leaves those copies in place), and revert refuses to overwrite
it without ``--force``.

    manifest.json  {"version": 2,
                    "files": [{"path", "real", "original": "0.orig" | null,
                               "written_sha256": [...]}, ...],
                    "created_dirs": [real paths]}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import ConfigError, HostagentError, NotFoundError, StateError
from .files import Change, read_one

__all__ = ["record", "restore_plan", "finish_restore", "load", "sha"]

MANIFEST = "manifest.json"
DAMAGED = "restore the files by hand from the .orig files beside it if needed, then remove the folder"


def sha(text: str | None) -> str:
    return "absent" if text is None else hashlib.sha256(text.encode()).hexdigest()


def _damaged(what: str, folder: Path) -> ConfigError:
    return ConfigError(f"the backup manifest is damaged: {what}", where=str(folder / MANIFEST), hint=DAMAGED)


def _upgrade(entry: dict) -> dict:
    """An entry of the first manifest format (one configure, no history)."""
    return {"path": entry["path"], "real": entry["real"],
            "original": entry["backup"] if entry["existed"] else None, "written_sha256": [entry["written_sha256"]]}


def load(folder: Path) -> dict | None:
    """The manifest in ``folder``, checked; None when there is no backup."""
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot read the backup manifest: {e.strerror}", where=str(path)) from None
    except ValueError as e:
        raise _damaged(f"not JSON ({e})", folder) from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise _damaged("no list of files", folder)
    entries = []
    for i, entry in enumerate(data["files"]):
        if not isinstance(entry, dict):
            raise _damaged(f"files[{i}] is not an object", folder)
        try:
            entry = entry if data.get("version") == 2 else _upgrade(entry)
            ok = (isinstance(entry["path"], str) and isinstance(entry["real"], str)
                  and (entry["original"] is None or isinstance(entry["original"], str))
                  and isinstance(entry["written_sha256"], list)
                  and all(isinstance(h, str) for h in entry["written_sha256"]))
        except (KeyError, TypeError) as e:
            raise _damaged(f"files[{i}] lacks {e}", folder) from None
        if not ok:
            raise _damaged(f"files[{i}] has a field of the wrong type", folder)
        entries.append(entry)
    dirs = data.get("created_dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise _damaged("created_dirs is not a list of paths", folder)
    return {"version": 2, "files": entries, "created_dirs": dirs}


def _write(path: Path, text: str) -> None:
    from ..fileio import write_atomic
    write_atomic(path, text, mode=0o600)


def record(folder: Path, items: list[Change]) -> tuple[list[str], object]:
    """Keep what ``items`` are about to replace (the first time hostagent changes each
    file) and the hash of their new texts. Returns notes for the user and an ``undo`` that
    puts the backup back as it was (when the writes then fail)."""
    manifest = load(folder)
    existed = manifest is not None
    manifest = manifest or {"version": 2, "files": [], "created_dirs": []}
    previous = json.dumps(manifest, indent=2) + "\n"
    by_path = {e["path"]: e for e in manifest["files"]}
    written: list[Path] = []
    notes = []
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for c in items:
            entry = by_path.get(c.path)
            if entry is None:
                i = len(manifest["files"])
                entry = {"path": c.path, "real": str(c.snapshot.real), "original": None, "written_sha256": []}
                if c.snapshot.text is not None:
                    entry["original"] = f"{i}.orig"
                    written.append(folder / entry["original"])
                    _write(written[-1], c.snapshot.text)
                manifest["files"].append(entry)
                by_path[c.path] = entry
            elif sha(c.snapshot.text) not in entry["written_sha256"] and not _is_original(folder, entry, c):
                i = manifest["files"].index(entry)
                n = sum(1 for _ in folder.glob(f"{i}.replaced-*")) + 1
                written.append(folder / f"{i}.replaced-{n}")
                _write(written[-1], c.snapshot.text or "")
                notes.append(f"{c.snapshot.real} changed since hostagent wrote it; 'runtime revert' restores it as "
                             f"it was before hostagent, without that change (kept in {written[-1]})")
            entry["written_sha256"].append(sha(c.new))
            parent = str(c.snapshot.real.parent)
            if c.make_parent and not c.snapshot.real.parent.is_dir() and parent not in manifest["created_dirs"]:
                manifest["created_dirs"].append(parent)
        _write(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    except OSError as e:
        _undo(folder, existed, previous, written)
        raise HostagentError(f"cannot save the backup: {e.strerror}", where=str(folder),
                             hint="nothing was changed") from None
    return notes, lambda: _undo(folder, existed, previous, written)


def _is_original(folder: Path, entry: dict, c: Change) -> bool:
    if entry["original"] is None:
        return c.snapshot.text is None
    try:
        return (folder / entry["original"]).read_text() == c.snapshot.text
    except OSError:
        return False


def _undo(folder: Path, existed: bool, manifest: str, written: list[Path]) -> None:
    for path in written:
        path.unlink(missing_ok=True)
    if existed:
        _write(folder / MANIFEST, manifest)
        return
    (folder / MANIFEST).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


def restore_plan(folder: Path, host, *, force: bool = False) -> tuple[list[Change], list[str]]:
    """The changes that put every recorded file back as it was before hostagent, and the
    folders hostagent created (removed afterwards if empty)."""
    manifest = load(folder)
    if manifest is None:
        raise NotFoundError("no backup to restore", where=str(folder),
                            hint="nothing was configured by hostagent since the last revert")
    out = []
    for e in manifest["files"]:
        snap = read_one(host, e["path"])
        old = None
        if e["original"] is not None:
            try:
                old = (folder / e["original"]).read_text()
            except FileNotFoundError:
                raise ConfigError(f"the saved original of {e['path']} is missing", where=str(folder / e["original"]),
                                  hint=f"nothing was restored; {DAMAGED}") from None
            except (OSError, UnicodeDecodeError) as e2:
                raise ConfigError(f"cannot read the saved original of {e['path']}: {e2}",
                                  where=str(folder / e["original"]), hint="nothing was restored") from None
        if snap.text == old:
            continue
        if sha(snap.text) not in e["written_sha256"] and not force:
            raise StateError("changed since hostagent wrote it", where=str(snap.real),
                             hint="nothing was restored; check the file, then use --force to restore anyway")
        out.append(Change(snap, old))
    return out, manifest["created_dirs"]


def finish_restore(folder: Path, created_dirs: list[str]) -> list[str]:
    """After the files are restored: remove the folders hostagent created if they are
    empty, and the backup (copies of others' versions, ``*.replaced-*``, stay). Returns
    the folders removed."""
    removed = []
    for d in reversed(created_dirs):
        try:
            Path(d).rmdir()
            removed.append(d)
        except OSError:
            pass              # gone already, or someone keeps files there
    (folder / MANIFEST).unlink()
    for p in folder.glob("*.orig"):
        p.unlink()
    try:
        folder.rmdir()
    except OSError:
        pass                  # the copies of versions others wrote are still there
    return removed
