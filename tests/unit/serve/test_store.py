"""serve/store.py on a real SQLite file: a retried request is one request, another owner's ids are not
found, a restart fails what was pending, and what was recorded outlives the Store that wrote it."""

from __future__ import annotations

from pathlib import Path

from lorarl.serve.store import DONE, FAILED, PENDING, Checkpoint, Store

A, B = "owner-a", "owner-b"


def test_a_retried_request_gets_the_first_ones_id(tmp_path: Path) -> None:
    store = Store(tmp_path / "serve.sqlite")
    first, new = store.submit(A, "optim_step", "m#1")
    again, new_again = store.submit(A, "optim_step", "m#1")
    other, new_other = store.submit(A, "optim_step", "m#2")
    assert new and not new_again and again == first
    assert new_other and other != first
    undeduped = {store.submit(A, "x", None)[0] for _ in range(3)}
    assert len(undeduped) == 3
    assert store.db.execute("SELECT COUNT(*) FROM requests WHERE dedupe = 'm#1'").fetchone()[0] == 1


def test_a_retry_key_is_each_owners_own(tmp_path: Path) -> None:
    """Another tenant sending the same key gets a request of its own, not an error or A's request."""
    store = Store(tmp_path / "serve.sqlite")
    mine, _ = store.submit(A, "optim_step", "m#1")
    theirs, new = store.submit(B, "optim_step", "m#1")
    assert new and theirs != mine
    assert store.submit(B, "optim_step", "m#1") == (theirs, False)


def test_another_owners_ids_are_not_found(tmp_path: Path) -> None:
    store = Store(tmp_path / "serve.sqlite")
    session = store.create_session(A)
    store.add_model("m", A, session, "base", {"rank": 4})
    store.add_sampler("smp", A, session, "base", None, None)
    store.add_checkpoint(Checkpoint("tinker://m/weights/x", "m", "weights", "x", "/f", 1.0, 3), A)
    request, _ = store.submit(A, "sample", "smp#0")
    assert store.session_exists(session, A) and not store.session_exists(session, B)
    assert not store.heartbeat(session, B) and not store.finish_session(session, B)
    assert store.model("m", A) is not None and store.model("m", B) is None
    assert store.sampler("smp", A) is not None and store.sampler("smp", B) is None
    assert store.checkpoint("tinker://m/weights/x", B) is None and store.checkpoints(B) == []
    assert store.request(request, A) is not None and store.request(request, B) is None
    store.remove_checkpoint("tinker://m/weights/x", B)
    assert store.checkpoint("tinker://m/weights/x", A) is not None


def test_fail_pending_fails_only_what_was_pending(tmp_path: Path) -> None:
    store = Store(tmp_path / "serve.sqlite")
    done, _ = store.submit(A, "k", "1")
    failed, _ = store.submit(A, "k", "2")
    pending, _ = store.submit(A, "k", "3")
    store.finish(done, b"ok", "application/json")
    store.fail(failed, "bad", "user")
    assert store.fail_pending("restarted") == 1
    got = {r: store.request(r, A) for r in (done, failed, pending)}
    assert got[done] is not None and got[done].status == DONE and got[done].result == b"ok"
    assert got[failed] is not None and (got[failed].error, got[failed].category) == ("bad", "user")
    assert got[pending] is not None and (got[pending].status, got[pending].error) == (FAILED, "restarted")
    assert got[pending].category == "server"


def test_what_was_recorded_outlives_the_store(tmp_path: Path) -> None:
    path = tmp_path / "serve.sqlite"
    store = Store(path)
    session = store.create_session(A)
    store.add_model("m", A, session, "base", {"rank": 8})
    done, _ = store.submit(A, "k", "m#0")
    pending, _ = store.submit(A, "k", "m#1")
    store.finish(done, b"\x00result", "application/x-protobuf")
    store.close()

    again = Store(path)
    finished = again.request(done, A)
    assert finished is not None and finished.result == b"\x00result"
    assert finished.content_type == "application/x-protobuf"
    assert again.submit(A, "k", "m#0") == (done, False)  # a retry after the restart: still applied once
    model = again.model("m", A)
    assert model is not None and model.lora == {"rank": 8} and model.loaded
    still = again.request(pending, A)
    assert still is not None and still.status == PENDING
    assert again.fail_pending("restarted") == 1


def test_silent_sessions_are_those_that_hold_models_and_stopped(tmp_path: Path) -> None:
    store = Store(tmp_path / "serve.sqlite")
    quiet, loud, finished, empty = (store.create_session(A) for _ in range(4))
    for i, session in enumerate((quiet, loud, finished)):
        store.add_model(f"m{i}", A, session, "base", {})
    store.db.execute("UPDATE sessions SET heartbeat = 0 WHERE id IN (?, ?)", (quiet, empty))
    store.finish_session(finished, A)
    assert sorted(store.silent_sessions(older_than=1.0)) == sorted([quiet, finished])
    store.set_loaded("m0", False, "/saved")
    assert store.silent_sessions(older_than=1.0) == [finished]
