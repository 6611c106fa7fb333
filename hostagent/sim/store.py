"""Where a simulated node keeps its state: ``<root>/.sim``, shared by every process.

Readers see whole files (written atomically); writers serialise on a file lock and
re-read under it, so the CLI, the daemon, hooks and tests all see one node.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from ..errors import NotFoundError, StateError
from ..fileio import pid_alive, write_atomic
from .files import mig_cap_names, sync_mig_caps
from .node import NodeFacts, NodeState

__all__ = ["SimStore", "SIM_DIR"]

SIM_DIR = ".sim"


def _parse(path: Path, build):
    """``build(json of path)``, with a file that is not what the simulator wrote (edited,
    truncated, from another version) reported as such instead of a parser's traceback."""
    try:
        return build(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise StateError(f"the simulated node's {path.name} is corrupt ({type(e).__name__}: {e})",
                         where=str(path),
                         hint=f"recreate the node: hostagent sim create --force --root {path.parent.parent}") from None


class SimStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.dir = self.root / SIM_DIR
        self._state_file = self.dir / "state.json"    # every simulated NVML call stats it
        self._facts: NodeFacts | None = None
        self._cache: tuple[tuple, NodeState] | None = None

    @property
    def state_file(self) -> Path:
        return self._state_file

    def exists(self) -> bool:
        return (self.dir / "node.json").is_file() and self.state_file.is_file()

    def check(self) -> None:
        if not self.exists():
            raise NotFoundError("not a simulated node (no .sim/node.json)", where=str(self.root),
                                hint=f"make it one first: hostagent sim create --profile dgx-a100 --root {self.root}")

    @property
    def facts(self) -> NodeFacts:
        if self._facts is None:
            self.check()
            self._facts = _parse(self.dir / "node.json", NodeFacts.from_dict)
        return self._facts

    def initialise(self, facts_raw: dict, state: NodeState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "node.json", json.dumps(facts_raw, indent=1))
        write_atomic(self.state_file, json.dumps(state.to_dict(), indent=1))
        self._facts = None
        self._cache = None

    def read(self) -> NodeState:
        """The current state; cached until the state file changes."""
        try:
            st = os.stat(self.state_file)
        except FileNotFoundError:
            self.check()
            raise
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._cache is None or self._cache[0] != key:
            state = _parse(self.state_file, NodeState.from_dict)
            self._cache = (key, state)
        state = self._cache[1]
        # The driver forgets a process the moment it exits.
        if any(not pid_alive(p.pid) for p in state.processes):
            state.processes = [p for p in state.processes if pid_alive(p.pid)]
        return state

    @contextlib.contextmanager
    def lock(self):
        self.check()
        with open(self.dir / "lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def mutate(self):
        """Yield a fresh copy of the state; commit it if the block returns normally."""
        with self.lock():
            state = _parse(self.state_file, NodeState.from_dict)
            state.processes = [p for p in state.processes if pid_alive(p.pid)]
            caps = mig_cap_names(state)
            yield state
            # No fsync: simulated state needs atomicity between processes, not durability,
            # and fsync would dominate the cost of every simulated NVML mutation. Compact
            # JSON: the indenting encoder is pure Python and several times slower.
            write_atomic(self.state_file, json.dumps(state.to_dict(), separators=(",", ":")),
                         durable=False)
            self._cache = None
            sync_mig_caps(self.root, self.facts, state, before=caps)
