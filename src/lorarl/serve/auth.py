"""Who may call `lorarl-serve`, and who owns what. The SDK sends its key in `X-API-Key` and requires
the "tml-" prefix itself. With `serve.api_key` or `serve.keys_file` only those keys are accepted (401
otherwise, which the SDK reports at once); on a loopback address without either, any "tml-" key is, and
each key is a tenant of its own. A key is never stored: its owner id is a hash of it, and every
session, model, sampler, checkpoint and request belongs to the owner id that made it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from lorarl.config.serve import ServeSection
from lorarl.file_kinds import NOT_REGULAR, special_file

PREFIX = "tml-"


class Unauthorized(Exception):
    """str() is one line for the client."""


class Keys:
    def __init__(self, cfg: ServeSection) -> None:
        self.accepted: set[str] | None = None  # None: any key with the prefix (loopback, no key given)
        if cfg.api_key is not None or cfg.keys_file is not None:
            self.accepted = {cfg.api_key} if cfg.api_key is not None else set()
            if cfg.keys_file is not None:
                self.accepted |= keys_in_file(cfg.keys_file)

    def owner(self, key: str | None) -> str:
        """The owner id of an accepted key; Unauthorized otherwise."""
        if not key:
            raise Unauthorized("no API key: set TINKER_API_KEY (or pass api_key=) to a key of this server")
        if not key.startswith(PREFIX) or (self.accepted is not None and key not in self.accepted):
            raise Unauthorized("this API key is not accepted by this server (serve.api_key, serve.keys_file)")
        return hashlib.sha256(key.encode()).hexdigest()[:32]


def read_keys_file(text: str) -> set[str]:
    """The keys of a keys file: one per line; blank lines and lines starting with '#' left out."""
    keys = {line.strip() for line in text.splitlines()}
    return {k for k in keys if k and not k.startswith("#")}


def keys_in_file(path: Path) -> set[str]:
    """The keys of serve.keys_file `path`; ValueError, one line naming it, if it is no regular file that
    can be read (a FIFO would wait for a writer), holds no key, or a key the SDK cannot send."""
    where = f"serve.keys_file {path}"
    if not path.is_file():
        why = NOT_REGULAR if special_file(path) else "a folder" if path.is_dir() else "no such file"
        raise ValueError(f"{where}: {why}")
    try:
        keys = read_keys_file(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not keys:
        raise ValueError(f"{where}: no key in it (one per line; blank lines and '#' lines are left out)")
    if bad := sorted(k for k in keys if not k.startswith(PREFIX)):
        raise ValueError(f"{where}: {len(bad)} key(s) without the SDK's {PREFIX!r} prefix, the first {bad[0][:8]}...")
    return keys
