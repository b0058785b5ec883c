"""What `lorarl-serve` must not lose: sessions, training clients (tenants), sampling sessions,
checkpoints and every request with its result, in one SQLite file in the run folder (`serve.sqlite`).

Why a database: the SDK retries a request whose answer it did not get (the same `seq_id`, or the same
`(session, seq)` for a new model or sampler), and a retried request must be applied once; and a server
killed with `kill -9` and started again with `--resume` must still answer the futures it had finished
and know every tenant, its owner and its last saved state. Only the API process opens the file, from
its one event loop, so there is one writer and every change is committed as it is made (WAL mode,
synchronous NORMAL: a killed server loses nothing committed; only a crash of the machine itself may
lose the last commits, and spares the ~2 ms fsync that FULL costs on each of a step's several commits).
A request that was still pending when the server stopped can never finish: `--resume` fails it, and
its client gets one line saying so.

Ownership: every row belongs to the key that made it (`owner`, a hash of the key; never the key).
Lookups take the owner, so another key's id is "not found", never "forbidden".
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, heartbeat REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
    lora TEXT NOT NULL, created REAL NOT NULL, last_request REAL NOT NULL,
    loaded INTEGER NOT NULL DEFAULT 1, resume_from TEXT, user_metadata TEXT);
CREATE TABLE IF NOT EXISTS samplers (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
    model_path TEXT, folder TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    path TEXT PRIMARY KEY, owner TEXT NOT NULL, model_id TEXT NOT NULL, kind TEXT NOT NULL,
    name TEXT NOT NULL, folder TEXT NOT NULL, created REAL NOT NULL, size_bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, dedupe TEXT, kind TEXT NOT NULL,
    status TEXT NOT NULL, result BLOB, content_type TEXT, error TEXT, category TEXT,
    created REAL NOT NULL, finished REAL, UNIQUE (owner, dedupe));
"""
PENDING, DONE, FAILED = "pending", "done", "failed"


@dataclass(frozen=True)
class Request:
    id: str
    kind: str
    status: str
    result: bytes | None
    content_type: str | None
    error: str | None
    category: str | None


@dataclass(frozen=True)
class Model:
    id: str
    session_id: str
    base_model: str
    lora: dict[str, Any]
    loaded: bool
    resume_from: str | None  # the folder of the state to load before its next request (after an unload)
    last_request: float


@dataclass(frozen=True)
class Sampler:
    id: str
    base_model: str
    model_path: str | None
    folder: str | None  # the PEFT adapter folder vLLM serves; None: the base model


@dataclass(frozen=True)
class Checkpoint:
    path: str  # tinker://<model_id>/<kind>/<name>
    model_id: str
    kind: str  # "weights" (SaveState) or "sampler_weights" (SaveForSampler)
    name: str
    folder: str
    created: float
    size_bytes: int


class Store:
    """The API process's one connection to serve.sqlite."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)  # autocommit: each statement committed
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ---- sessions ------------------------------------------------------------------------------

    def create_session(self, owner: str) -> str:
        session = f"s{uuid.uuid4().hex[:12]}"
        now = time.time()
        self.db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, 0)", (session, owner, now, now))
        return session

    def session_exists(self, session: str, owner: str) -> bool:
        row = self.db.execute("SELECT 1 FROM sessions WHERE id = ? AND owner = ?", (session, owner)).fetchone()
        return row is not None

    def heartbeat(self, session: str, owner: str) -> bool:
        cur = self.db.execute(
            "UPDATE sessions SET heartbeat = ? WHERE id = ? AND owner = ? AND finished = 0",
            (time.time(), session, owner),
        )
        return cur.rowcount == 1

    def finish_session(self, session: str, owner: str) -> bool:
        cur = self.db.execute("UPDATE sessions SET finished = 1 WHERE id = ? AND owner = ?", (session, owner))
        return cur.rowcount == 1

    def silent_sessions(self, older_than: float) -> list[str]:
        """Sessions whose last heartbeat is before `older_than` (or that finished) and still hold models."""
        rows = self.db.execute(
            "SELECT DISTINCT s.id FROM sessions s JOIN models m ON m.session_id = s.id "
            "WHERE m.loaded = 1 AND (s.heartbeat < ? OR s.finished = 1)",
            (older_than,),
        )
        return [r[0] for r in rows]

    # ---- models (tenants) ----------------------------------------------------------------------

    def add_model(
        self, model_id: str, owner: str, session: str, base: str, lora: dict[str, Any], metadata: Any = None
    ) -> None:
        now = time.time()
        self.db.execute(
            "INSERT OR IGNORE INTO models (id, owner, session_id, base_model, lora, created, last_request, "
            "user_metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (model_id, owner, session, base, json.dumps(lora), now, now, json.dumps(metadata)),
        )

    def model(self, model_id: str, owner: str) -> Model | None:
        row = self.db.execute(
            "SELECT id, session_id, base_model, lora, loaded, resume_from, last_request FROM models "
            "WHERE id = ? AND owner = ?",
            (model_id, owner),
        ).fetchone()
        if row is None:
            return None
        return Model(row[0], row[1], row[2], json.loads(row[3]), bool(row[4]), row[5], row[6])

    def models_of_session(self, session: str) -> list[str]:
        rows = self.db.execute("SELECT id FROM models WHERE session_id = ? AND loaded = 1", (session,))
        return [r[0] for r in rows]

    def loaded_models(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT id FROM models WHERE loaded = 1")]

    def set_loaded(self, model_id: str, loaded: bool, resume_from: str | None = None) -> None:
        self.db.execute(
            "UPDATE models SET loaded = ?, resume_from = ? WHERE id = ?", (int(loaded), resume_from, model_id)
        )

    def touch_model(self, model_id: str) -> None:
        self.db.execute("UPDATE models SET last_request = ? WHERE id = ?", (time.time(), model_id))

    # ---- samplers ------------------------------------------------------------------------------

    def add_sampler(
        self, sampler_id: str, owner: str, session: str, base: str, model_path: str | None, folder: str | None
    ) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO samplers VALUES (?, ?, ?, ?, ?, ?, ?)",
            (sampler_id, owner, session, base, model_path, folder, time.time()),
        )

    def sampler(self, sampler_id: str, owner: str) -> Sampler | None:
        row = self.db.execute(
            "SELECT id, base_model, model_path, folder FROM samplers WHERE id = ? AND owner = ?", (sampler_id, owner)
        ).fetchone()
        return None if row is None else Sampler(*row)

    # ---- checkpoints ---------------------------------------------------------------------------

    def add_checkpoint(self, ckpt: Checkpoint, owner: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (ckpt.path, owner, ckpt.model_id, ckpt.kind, ckpt.name, ckpt.folder, ckpt.created, ckpt.size_bytes),
        )

    def checkpoint(self, path: str, owner: str) -> Checkpoint | None:
        row = self.db.execute(
            "SELECT path, model_id, kind, name, folder, created, size_bytes FROM checkpoints "
            "WHERE path = ? AND owner = ?",
            (path, owner),
        ).fetchone()
        return None if row is None else Checkpoint(*row)

    def checkpoints(self, owner: str, model_id: str | None = None) -> list[Checkpoint]:
        """Newest first."""
        where, args = ("owner = ?", (owner,)) if model_id is None else ("owner = ? AND model_id = ?", (owner, model_id))
        rows = self.db.execute(
            "SELECT path, model_id, kind, name, folder, created, size_bytes FROM checkpoints "
            f"WHERE {where} ORDER BY created DESC",
            args,
        )
        return [Checkpoint(*r) for r in rows]

    def checkpoints_of_model(self, model_id: str) -> list[Checkpoint]:
        """Newest first, whoever asks (the server's own bookkeeping: resume)."""
        rows = self.db.execute(
            "SELECT path, model_id, kind, name, folder, created, size_bytes FROM checkpoints "
            "WHERE model_id = ? ORDER BY created DESC",
            (model_id,),
        )
        return [Checkpoint(*r) for r in rows]

    def remove_checkpoint(self, path: str, owner: str) -> None:
        self.db.execute("DELETE FROM checkpoints WHERE path = ? AND owner = ?", (path, owner))

    # ---- requests (futures) --------------------------------------------------------------------

    def submit(self, owner: str, kind: str, dedupe: str | None) -> tuple[str, bool]:
        """A new pending request's id, or the id of the request `dedupe` names already (a retry): (id,
        True if new)."""
        if dedupe is not None:
            row = self.db.execute("SELECT id FROM requests WHERE dedupe = ? AND owner = ?", (dedupe, owner)).fetchone()
            if row is not None:
                return row[0], False
        request_id = f"r{uuid.uuid4().hex}"
        self.db.execute(
            "INSERT INTO requests (id, owner, dedupe, kind, status, created) VALUES (?, ?, ?, ?, ?, ?)",
            (request_id, owner, dedupe, kind, PENDING, time.time()),
        )
        return request_id, True

    def finish(self, request_id: str, result: bytes, content_type: str) -> None:
        self.db.execute(
            "UPDATE requests SET status = ?, result = ?, content_type = ?, finished = ? WHERE id = ?",
            (DONE, result, content_type, time.time(), request_id),
        )

    def fail(self, request_id: str, error: str, category: str) -> None:
        self.db.execute(
            "UPDATE requests SET status = ?, error = ?, category = ?, finished = ? WHERE id = ?",
            (FAILED, error, category, time.time(), request_id),
        )

    def request(self, request_id: str, owner: str) -> Request | None:
        row = self.db.execute(
            "SELECT id, kind, status, result, content_type, error, category FROM requests WHERE id = ? AND owner = ?",
            (request_id, owner),
        ).fetchone()
        return None if row is None else Request(*row)

    def fail_pending(self, error: str) -> int:
        """Fail every request still pending (at a restart: none of them can finish now); how many."""
        cur = self.db.execute(
            "UPDATE requests SET status = ?, error = ?, category = 'server', finished = ? WHERE status = ?",
            (FAILED, error, time.time(), PENDING),
        )
        return cur.rowcount
