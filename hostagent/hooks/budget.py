"""What one run of the hook may spend on the image's files, whatever the image holds.

Each read is bounded where it happens (elfso, cachefile); this bounds their sum, so no
image can keep the hook busy (4000 hard links of one library, 500 symlinks to it, a million
names). A file is parsed once per run, by its inode (``parsed``), under however many names
and links it is reached. Past ``MAX_NAMES`` folder entries, ``MAX_FILES`` files parsed or
``MAX_BYTES`` read, the hook stops reading (``Exhausted``, an ``elfso.Unsupported``) and
leaves the cache to the host's ldconfig in its sandbox, which has CPU and time limits of its
own. The hook's own work has a deadline (``OWN_SECONDS``): past it the call fails.
"""

import time

from .elfso import Unsupported
from .errors import HookError

__all__ = ["Budget", "Exhausted", "MAX_NAMES", "MAX_FILES", "MAX_BYTES", "OWN_SECONDS"]

MAX_NAMES = 1 << 18        # folder entries looked at, every folder together
MAX_FILES = 1 << 14        # distinct files parsed (a driver has a hundred libraries)
MAX_BYTES = 64 << 20       # read from the image's files (a library's headers: a few KiB)
OWN_SECONDS = 20.0         # the hook's own work; ldconfig's time is --ldconfig-timeout


class Exhausted(Unsupported):
    """The image needs more reading than a run may do: ldconfig decides."""


class Budget:
    __slots__ = ("names", "files", "bytes", "deadline", "parsed")

    def __init__(self, seconds: float = OWN_SECONDS):
        self.names, self.files, self.bytes = MAX_NAMES, MAX_FILES, MAX_BYTES
        self.deadline = time.monotonic() + seconds
        self.parsed: dict = {}            # (st_dev, st_ino) -> what elfso.read said of it

    def name(self) -> None:
        self.names -= 1
        if self.names < 0:
            raise Exhausted(f"more than {MAX_NAMES} folder entries")
        if not self.names & 1023:
            self.in_time()

    def file(self) -> None:
        self.files -= 1
        if self.files < 0:
            raise Exhausted(f"more than {MAX_FILES} files to read")
        self.in_time()

    def read(self, count: int) -> None:
        self.bytes -= count
        if self.bytes < 0:
            raise Exhausted(f"more than {MAX_BYTES} bytes to read")

    def in_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise HookError(f"the hook's own work did not finish within {OWN_SECONDS:g} s (an image built to "
                            "slow it down?); nothing more was read")
