"""`InferenceClient`: adapter paths as the server's machine sees them, request timeouts that follow the
tokens asked for, and adapter names never taken from another run (against a loopback stand-in)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from lorarl.inference.client import AdapterNameTaken, InferenceClient, WorkerStalled
from tests.unit.inference.fake_vllm import FakeVLLM


class Recording(InferenceClient):
    """The real client, with its HTTP request recorded instead of sent."""

    sent: list[dict[str, Any]]

    async def _request(self, method: str, path: str, json: dict[str, Any] | None = None) -> tuple[int, str]:
        self.sent = [*getattr(self, "sent", []), json or {}]
        return 200, ""


def test_the_adapter_path_is_mapped_to_the_servers_copy_of_the_run_folder() -> None:
    client = Recording("http://h:1", run_dirs=("/runs/exp", "/tmp/lorarl-nodes/abc/exp"))
    asyncio.run(client.load_adapter("exp-step2", "/runs/exp/broadcasts/step_2"))
    asyncio.run(client.load_adapter("x", "/elsewhere/step_1"))  # not under the run folder: as it is
    assert [b["lora_path"] for b in client.sent] == ["/tmp/lorarl-nodes/abc/exp/broadcasts/step_2", "/elsewhere/step_1"]
    plain = Recording("http://h:1")
    asyncio.run(plain.load_adapter("exp-step2", "/runs/exp/broadcasts/step_2"))
    assert plain.sent[0]["lora_path"] == "/runs/exp/broadcasts/step_2"


def test_a_requests_timeout_follows_the_tokens_it_asks_for() -> None:
    client = InferenceClient("http://h:1", timeout=10.0, tokens_per_s=4.0)
    assert client.timeout_for({"max_tokens": 100, "n": 8}) == 35.0  # the n samples decode side by side
    assert client.timeout_for({"lora_name": "x"}) == client.timeout_for(None) == 10.0
    assert InferenceClient("http://h:1", timeout=10.0).timeout_for({"max_tokens": 100}) == 10.0


def test_a_frozen_server_is_reported_stalled_once_its_timeout_passes() -> None:
    async def ask(url: str) -> None:
        client = InferenceClient(url, timeout=0.3, tokens_per_s=100.0)
        try:
            await client.complete("m", [1, 2], n=1, temperature=1.0, top_p=1.0, max_tokens=20)
        finally:
            await client.close()

    with FakeVLLM() as server:
        server.frozen.set()
        start = time.monotonic()
        with pytest.raises(WorkerStalled, match="no answer within 0.5 s"):
            asyncio.run(ask(server.url))
        assert 0.5 <= time.monotonic() - start < 5  # 0.3 s + 20 tokens at 100/s
        assert server.completions == 0


def test_a_name_the_server_already_serves_is_never_replaced_unasked() -> None:
    async def load(url: str, replace: bool) -> None:
        client = InferenceClient(url)
        try:
            await client.load_adapter("exp-step0", "/runs/b/exp/broadcasts/step_0", replace=replace)
        finally:
            await client.close()

    with FakeVLLM() as server:
        server.adapters["exp-step0"] = "/runs/a/exp/broadcasts/step_0"  # another run's, same name
        with pytest.raises(AdapterNameTaken, match="already serves an adapter named exp-step0") as taken:
            asyncio.run(load(server.url, replace=False))
        assert taken.value.root == "/runs/a/exp/broadcasts/step_0"
        assert server.adapters == {"exp-step0": "/runs/a/exp/broadcasts/step_0"}
        asyncio.run(load(server.url, replace=True))  # the caller found its run ended
        assert server.adapters == {"exp-step0": "/runs/b/exp/broadcasts/step_0"}
