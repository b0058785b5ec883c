"""The record of the files lorarl wrote, so that lorarl removes or replaces only those.

A folder lorarl writes into (a run folder, a merge output, a plot folder) holds `.lorarl-written`:
one path per line, relative to that folder, of each file lorarl wrote in it, or of each folder it
wrote whole (`rollouts/step_3/`, with a trailing slash). A folder written whole
(`write_folder_atomically`) lists its own files in its MANIFEST.json, with their sizes and, for
checkpoints, their SHA-256, so that a reader can also tell whether it is intact (`manifest_problem`).

Removing is by this record only: `remove_written` deletes the files recorded (and of a folder written
whole, the files its manifest lists), then the folders that this left empty; a file lorarl did not
write stays, and so does its folder. `unwritten` lists such files, for the commands that must refuse
rather than leave them (a stale checkpoint that a later --resume would pick up, for instance).

The record is appended to with one write per call (O_APPEND), so that the processes of a run
(`rl`, trainer, orchestrator) can record into it at once; it is rewritten only by `forget_missing`,
which `RunFolder.prepare` calls while no other process of the run is alive.

lorarl never makes a symbolic link, so one found where it writes, records or removes was put there by
someone else and leads to their files: the record is opened without following one (O_NOFOLLOW), and
`links_under` / `link_in_way` find the others for the commands to refuse them (UnsafeEntry) first.
Nor does it make a hard link, which a write in place (a log, a config) would go through to the other
name's file: `links_under` finds those too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

RECORD = ".lorarl-written"
MANIFEST = "MANIFEST.json"
STABLE = "STABLE"  # added to an adapter folder after its rename: part of the folder lorarl wrote
# A folder half-written by write_folder_atomically when its process died (`.step_3.tmp-1234`): lorarl's
# own, never read, never a user's: left where it is.
TEMPORARY = re.compile(r"^\..+\.(tmp|old)-\d+$")


class UnsafeEntry(OSError):
    """A link (or, for the record, something not a file) where lorarl would write, record or remove;
    str() is one line for the user, naming it."""


def link_refusal(link: Path) -> UnsafeEntry:
    """The one-line refusal of the link `link`, symbolic or hard (is_link)."""
    if not link.is_symlink():
        return UnsafeEntry(
            f"{link} is a hard link (one file with another name elsewhere), which lorarl did not make and "
            "never writes through (it would change that other file): remove it, or choose another folder"
        )
    return UnsafeEntry(
        f"{link} is a symbolic link, which lorarl did not make and never writes, records or removes through "
        "(it leads to someone else's files): remove the link, or choose another folder"
    )


def is_link(path: Path) -> bool:
    """A symbolic link, or a file with another name elsewhere (a hard link: writing it in place, as logs
    and configs are written, would change the other name's contents too). lorarl makes neither."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISLNK(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_nlink > 1)


def links_under(root: Path, names: Iterable[str]) -> list[Path]:
    """The links (is_link) at `root/<name>`, or anywhere below it, for each of `names`, sorted."""
    found = []
    for name in names:
        path = root / name
        if is_link(path):
            found.append(path)
        elif path.is_dir():
            for parent, dirs, files in os.walk(path):  # does not descend into a link to a folder
                found += [Path(parent, n) for n in [*dirs, *files] if is_link(Path(parent, n))]
    return sorted(found)


def link_in_way(dest: Path) -> Path | None:
    """The first link (is_link) among `dest` and the folders on its path below the folder whose record
    covers it (below `dest`'s parent when none does): that folder and those above it are the user's
    choice of where to write, what lies below is lorarl's. None when there is none."""
    root = record_root(dest.parent) or dest.parent
    if not dest.is_relative_to(root):
        return None
    parts = dest.relative_to(root).parts
    return next((p for i in range(len(parts)) if is_link(p := root.joinpath(*parts[: i + 1]))), None)


def record_problem(root: Path) -> str | None:
    """Why `root`'s record cannot be read or added to (a link, or not a file), in one line; None if it
    is a file or does not exist."""
    try:
        mode = os.lstat(root / RECORD).st_mode
    except FileNotFoundError:
        return None
    if is_link(root / RECORD):
        return str(link_refusal(root / RECORD))
    if not stat.S_ISREG(mode):
        return (
            f"{root / RECORD} is {'a folder' if stat.S_ISDIR(mode) else 'not a file'}, not lorarl's record of the "
            "files it wrote there: move it away, or choose another folder"
        )
    return None


def _open_record(root: Path, flags: int) -> int:
    """A descriptor of `root`'s record, never through a link; UnsafeEntry if it is one or not a file."""
    try:
        # O_NONBLOCK: a FIFO put there is refused below rather than waited on; a file ignores the flag.
        fd = os.open(root / RECORD, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise UnsafeEntry(record_problem(root) or f"{root / RECORD}: {e.strerror}") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeEntry(record_problem(root) or f"{root / RECORD} is not a file")
    return fd


def record_root(path: Path) -> Path | None:
    """The folder whose record covers `path`: the nearest one, `path` itself or above it, that has a
    record or a run folder's marker (run.json); None when there is none."""
    for folder in (path, *path.parents):  # a record that is a link or a folder is found, to be refused
        if os.path.lexists(folder / RECORD) or (folder / "run.json").is_file():
            return folder
    return None


def record(root: Path, paths: Iterable[Path]) -> None:
    """Add `paths` (files, or folders written whole) under `root` to its record, creating it."""
    lines = "".join(_entry(root, p) + "\n" for p in paths)
    if lines:
        fd = _open_record(root, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, lines.encode())  # one write: lines of several processes never interleave
        finally:
            os.close(fd)


def record_written(*paths: Path) -> None:
    """Record `paths` in the record that covers them (see `record_root`); nothing when none does."""
    for path in paths:
        if (root := record_root(path.parent)) is not None:
            record(root, [path])


def _entry(root: Path, path: Path) -> str:
    relative = path.relative_to(root).as_posix()
    return relative + "/" if path.is_dir() else relative


def recorded(root: Path) -> list[str]:
    """The record's entries, oldest first, each once; one that would leave `root` (a damaged or forged
    record) is ignored; UnsafeEntry if the record is a link or not a file."""
    try:
        fd = _open_record(root, os.O_RDONLY)
    except FileNotFoundError:
        return []
    with open(fd, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    return list(dict.fromkeys(line for line in lines if _inside(line)))


def _inside(relative: str) -> bool:
    """Whether `relative` names something inside the folder it is relative to."""
    path = Path(relative)
    return bool(relative) and not path.is_absolute() and ".." not in path.parts


def written_files(root: Path) -> set[Path]:
    """Every file under `root` that lorarl wrote: those recorded, and those of the folders recorded whole."""
    files = {root / RECORD}
    for entry in recorded(root):
        if entry.endswith("/"):
            files.update(folder_files(root / entry))
        else:
            files.add(root / entry)
    return files


def folder_files(folder: Path) -> set[Path]:
    """The files of a folder lorarl wrote whole: its manifest's, the manifest itself and STABLE."""
    return {folder / MANIFEST, folder / STABLE, *(folder / name for name in read_manifest(folder) if _inside(name))}


def unwritten(root: Path, names: Iterable[str]) -> list[Path]:
    """The files under `root/<name>` (for each of `names`) that lorarl did not write, sorted."""
    mine = written_files(root)
    found = []
    for name in names:
        path = root / name
        candidates = [path] if path.is_file() or path.is_symlink() else _walk(path)
        found += [p for p in candidates if p not in mine]
    return sorted(found)


def foreign_files(folder: Path) -> list[Path]:
    """The files in `folder`, written whole by lorarl, that its manifest does not list, sorted."""
    mine = folder_files(folder)
    return sorted(p for p in _walk(folder) if p not in mine)


def _walk(folder: Path) -> Iterator[Path]:
    """The files and symlinks under `folder`, not following links, skipping lorarl's temporaries."""
    for parent, dirs, files in os.walk(folder):
        links = [d for d in dirs if Path(parent, d).is_symlink()]
        dirs[:] = [d for d in dirs if d not in links and not TEMPORARY.match(d)]
        yield from (Path(parent, name) for name in [*files, *links])


def remove_written(root: Path, names: Iterable[str]) -> None:
    """Delete what the record lists under `root/<name>` for each of `names`, then the folders this
    left empty; a file lorarl did not write stays, and so does the folder that holds it."""
    prefixes = tuple(names)
    for entry in recorded(root):
        if entry.rstrip("/").split("/")[0] in prefixes:
            if entry.endswith("/"):
                remove_folder(root / entry, root)
            else:
                _unlink(root / entry, root)


def remove_folder(folder: Path, stop: Path | None = None) -> None:
    """Delete the files of `folder`, written whole by lorarl (its manifest's, MANIFEST.json, STABLE),
    then the folders this emptied, up to `stop` (default: `folder`'s parent). A folder lorarl did not
    write whole (no manifest) loses nothing."""
    if folder.is_symlink():  # a link put in its place leads to someone else's files
        return
    files = folder_files(folder)
    for path in sorted(files, key=lambda p: p == folder / MANIFEST):  # the manifest last
        _unlink(path, folder, prune=False)
    for parent in sorted({p.parent for p in files}, key=lambda p: -len(p.parts)):
        _prune(parent, stop or folder.parent)


def _unlink(path: Path, root: Path, prune: bool = True) -> None:
    """Delete the file `path` if it is one and lies in `root` itself, not through a link to elsewhere."""
    if (path.is_symlink() or path.is_file()) and path.parent.resolve().is_relative_to(root.resolve()):
        path.unlink()
    if prune:
        _prune(path.parent, root)


def _prune(folder: Path, stop: Path) -> None:
    """Remove `folder` and its parents below `stop` while they are empty."""
    while folder != stop and folder.is_relative_to(stop) and _rmdir_if_empty(folder):
        folder = folder.parent


def _rmdir_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()  # fails unless empty: nothing but an empty folder is ever removed here
        return True
    except OSError:
        return False


def forget_missing(root: Path) -> None:
    """Rewrite the record without the entries whose files are gone (call it with no writer alive)."""
    kept = [e for e in recorded(root) if (root / e).exists() or (root / e).is_symlink()]
    if os.path.lexists(root / RECORD):
        fd = _open_record(root, os.O_WRONLY | os.O_TRUNC)
        with open(fd, "w", encoding="utf-8") as f:
            f.write("".join(e + "\n" for e in kept))


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(folder: Path, checksums: bool) -> None:
    """MANIFEST.json of `folder`: each file and its size, and with `checksums` its SHA-256."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST)
    entries: dict[str, object] = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        if checksums
        else p.stat().st_size
        for p in files
    }
    (folder / MANIFEST).write_text(json.dumps(entries, indent=1) + "\n")


def read_manifest(folder: Path) -> dict[str, object]:
    """`folder`'s manifest (file -> size, or {"size", "sha256"}); empty when it has none or it is unreadable."""
    try:
        files = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return files if isinstance(files, dict) else {}


def manifest_problem(folder: Path, checksums: bool = True) -> str | None:
    """Why `folder` is not whole, in a few words naming the file, or None when every file its
    manifest lists is there at its size and (with `checksums`, where recorded) its SHA-256."""
    if not (folder / MANIFEST).is_file():
        return f"{folder.name}/ has no {MANIFEST} (it was not finished)"
    files = read_manifest(folder)
    if not files:
        return f"{folder / MANIFEST} is unreadable"
    for name, expected in files.items():
        size, digest = (
            (expected.get("size"), expected.get("sha256")) if isinstance(expected, dict) else (expected, None)
        )
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, not {size}"
        if checksums and digest is not None and file_sha256(path) != digest:
            return f"{path} does not match its SHA-256"
    return None
