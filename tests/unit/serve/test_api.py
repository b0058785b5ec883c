"""serve/api.py over HTTP (aiohttp's test server, a real Service and Store, no trainer): a client's
mistake is a 4xx with one line of JSON `detail` naming what is wrong, never a 5xx the SDK would retry."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from lorarl.config.serve import ServeConfig, ServeSection
from lorarl.serve.api import app
from lorarl.serve.auth import Keys
from lorarl.serve.folder import ServeFolder
from lorarl.serve.service import Service
from lorarl.serve.store import Store

KEY = {"X-API-Key": "tml-a"}
V1 = "/api/v1"


def _serve(tmp_path: Path, calls: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    folder = ServeFolder(tmp_path / "run")
    folder.root.mkdir()
    cfg = ServeConfig(model={"name": "m"}, output_dir=tmp_path)
    service = Service(cfg, Store(folder.database), folder, None, None, 10)  # type: ignore[arg-type]

    async def main() -> None:
        async with TestClient(TestServer(app(service, Keys(ServeSection())))) as client:
            await calls(client)

    asyncio.run(main())


async def _detail(response: Any, status: int) -> str:
    assert response.status == status, await response.text()
    body = await response.json()
    assert set(body) == {"detail"} and "\n" not in body["detail"]
    return str(body["detail"])


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("get", "/nowhere", None, 404, "Not Found"),
        ("post", f"{V1}/create_session", "{not json", 400, "body: not JSON"),
        ("post", f"{V1}/weights_info", "{not json", 400, "body: not JSON"),
        ("post", f"{V1}/weights_info", "[]", 400, "tinker_path: required"),
        ("post", f"{V1}/create_model", '{"model_seq_id": 0}', 400, "session_id: Field required"),
        ("post", f"{V1}/retrieve_future", '{"request_id": "r1"}', 404, "request 'r1' not found"),
        ("post", f"{V1}/get_info", '{"model_id": "s0123456789ab:train:0"}', 404, "not found"),
        ("post", f"{V1}/forward_backward", "{}", 400, "send it as protobuf"),
        ("get", f"{V1}/checkpoints?limit=x", None, 400, "limit, offset"),
        ("get", f"{V1}/create_session", None, 405, "Method Not Allowed"),
        ("post", f"{V1}/weights_info", '{"tinker_path": "/etc/passwd"}', 400, "not a path of this server"),
    ],
)
def test_client_errors_are_4xx_with_one_line(
    tmp_path: Path, method: str, path: str, body: str | None, status: int, says: str
) -> None:
    async def calls(client: TestClient[Any, Any]) -> None:
        response = await client.request(method, path, data=body, headers=KEY)
        assert says in await _detail(response, status)

    _serve(tmp_path, calls)


def test_keys_are_checked_before_anything_but_healthz(tmp_path: Path) -> None:
    async def calls(client: TestClient[Any, Any]) -> None:
        assert (await client.get(f"{V1}/healthz")).status == 200
        assert "TINKER_API_KEY" in await _detail(await client.post(f"{V1}/create_session", data="{}"), 401)
        refused = await client.get("/nowhere", headers={"X-API-Key": "sk-a"})
        assert "not accepted" in await _detail(refused, 401)

    _serve(tmp_path, calls)


def test_another_keys_session_is_not_found(tmp_path: Path) -> None:
    async def calls(client: TestClient[Any, Any]) -> None:
        new = {"tags": [], "sdk_version": "0", "user_metadata": None}
        created = await client.post(f"{V1}/create_session", json=new, headers=KEY)
        assert created.status == 200, await created.text()
        session = (await created.json())["session_id"]
        ours = await client.post(f"{V1}/session_heartbeat", json={"session_id": session}, headers=KEY)
        assert ours.status == 200
        theirs = await client.post(
            f"{V1}/session_heartbeat", json={"session_id": session}, headers={"X-API-Key": "tml-b"}
        )
        assert "not found" in await _detail(theirs, 404)

    _serve(tmp_path, calls)


def test_a_finished_sessions_heartbeat_is_gone_so_the_sdk_stops_sending_it(tmp_path: Path) -> None:
    """410, the answer on which the SDK's heartbeat loop ends (internal_client_holder.py): a 404 there
    is retried every 10 s and warned about, for as long as the client lives."""

    async def calls(client: TestClient[Any, Any]) -> None:
        new = {"tags": [], "sdk_version": "0", "user_metadata": None}
        session = (await (await client.post(f"{V1}/create_session", json=new, headers=KEY)).json())["session_id"]
        finished = await client.post(f"{V1}/sessions/{session}/finish", json={"status": "success"}, headers=KEY)
        assert finished.status == 200, await finished.text()
        beat = await client.post(f"{V1}/session_heartbeat", json={"session_id": session}, headers=KEY)
        assert "has finished" in await _detail(beat, 410)
        unknown = await client.post(f"{V1}/session_heartbeat", json={"session_id": "nope"}, headers=KEY)
        assert "not found" in await _detail(unknown, 404)

    _serve(tmp_path, calls)
