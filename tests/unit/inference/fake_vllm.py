"""A loopback stand-in for vLLM's OpenAI server, for unit tests of the client, pool and health check:
the few endpoints they call, in vLLM's shapes, and a switch that freezes it (as SIGSTOP would:
requests are accepted and never answered)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web

from tests.conftest import free_port


class FakeVLLM:
    """Serves `model` at `url` from a thread of its own; `frozen` holds every answer until cleared;
    with `api_key`, /v1/ requests without it get 401, as vLLM's --api-key does."""

    def __init__(self, model: str = "/models/tiny", api_key: str | None = None) -> None:
        self.model, self.api_key = model, api_key
        self.adapters: dict[str, str] = {}  # name -> path
        self.completions = 0
        self.frozen = threading.Event()
        self.url = f"http://127.0.0.1:{free_port()}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _wait_if_frozen(self) -> None:
        while self.frozen.is_set():
            await asyncio.sleep(0.02)

    async def health(self, request: web.Request) -> web.Response:
        await self._wait_if_frozen()
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        await self._wait_if_frozen()
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        base = {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model, "parent": None}
        loras = [{"id": n, "object": "model", "owned_by": "vllm", "root": p, "parent": self.model}
                 for n, p in self.adapters.items()]  # fmt: skip
        return web.json_response({"object": "list", "data": [base, *loras]})

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        await self._wait_if_frozen()
        self.completions += 1
        choices = [{"index": i, "text": "a", "token_ids": [1], "logprobs": {"token_logprobs": [-0.5]},
                    "finish_reason": "stop"} for i in range(body["n"])]  # fmt: skip
        return web.json_response({"choices": choices})

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["lora_name"] in self.adapters:
            return web.Response(status=400, text=json.dumps({"message": "The lora adapter has already been loaded"}))
        self.adapters[body["lora_name"]] = body["lora_path"]
        return web.Response(text="ok")

    async def unload(self, request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        return web.Response(text="ok") if self.adapters.pop(name, None) else web.Response(status=404)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        routes: list[Any] = [
            web.get("/health", self.health),
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.complete),
            web.post("/v1/load_lora_adapter", self.load),
            web.post("/v1/unload_lora_adapter", self.unload),
        ]
        app.add_routes(routes)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", int(self.url.rsplit(":", 1)[1])).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> FakeVLLM:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.frozen.clear()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
