"""Whether a path a user gave names a file lorarl can read: a FIFO would make `open()` wait for a
writer for ever, and a device (/dev/zero) be read for ever, so every reader of a user's file (config,
SFT data, keys file, metrics) asks here first and says why not in the same words; and how such a path
is named in a message when it is too long for the file system."""

from __future__ import annotations

import os
import stat
from pathlib import Path

NOT_REGULAR = "not a regular file (a FIFO, socket or device)"


def special_file(path: Path | str) -> bool:
    """Whether `path` (through links) exists and is neither a regular file nor a folder."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, or unreadable: each reader says so in its own words
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def shortened(path: Path | str, most: int = 100) -> str:
    """`path` for a one-line message: a name too long for the file system (ENAMETOOLONG) can be
    thousands of characters, cut to `most` of them."""
    name = str(path)
    return name if len(name) <= most else name[:most] + "..."
