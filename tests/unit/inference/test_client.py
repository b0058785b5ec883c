"""`InferenceClient.load_adapter` sends the adapter's path as the server's machine sees it."""

from __future__ import annotations

import asyncio
from typing import Any

from lorarl.inference.client import InferenceClient


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
