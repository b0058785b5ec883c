"""A reverse proxy in front of a real vLLM server that rewrites the JSON bodies of its POST requests,
to make a worker serve something other than the adapter the run asked for: the base model under the
adapter's name, version N-1 under version N's name, or a copy of the adapter with lora_B zeroed. The
fault tests of the served-adapter check (test_faults_served.py) point `inference.urls` at it.

It runs its own event loop in a thread of the test process, so that a test starts it with `with`.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from safetensors.torch import load_file, save_file

from tests.conftest import free_port

Rewrite = Callable[[str, dict[str, Any]], dict[str, Any]]
ADAPTER_NAME = re.compile(r"^(?P<run>.+)-step(?P<version>\d+)$")
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}  # aiohttp sets its own


class RewritingProxy:
    """Forwards every request to `upstream`; a POST's JSON body goes through `rewrite(path, body)`
    first. `rewrites` lists (path, body before, body after) for each body it changed."""

    def __init__(self, upstream: str, rewrite: Rewrite) -> None:
        self.upstream, self.rewrite = upstream.rstrip("/"), rewrite
        self.url = f"http://127.0.0.1:{free_port()}"
        self.rewrites: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        app = web.Application(client_max_size=2**30)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", int(self.url.rsplit(":", 1)[1])).start()

    async def _stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        if self._session:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.Response:
        data = await request.read()
        if request.method == "POST" and request.content_type == "application/json":
            body = await request.json()
            new = self.rewrite(request.path, dict(body))
            if new != body:
                self.rewrites.append((request.path, body, new))
            data = json.dumps(new).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        assert self._session is not None
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=data, headers=headers
        ) as r:
            content = await r.read()
            return web.Response(body=content, status=r.status, content_type=r.content_type)

    def __enter__(self) -> RewritingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


def adapter_version(name: str, run_name: str) -> int | None:
    """N of `<run_name>-step<N>` (orchestrator/adapters.py), None for any other model name."""
    m = ADAPTER_NAME.match(name)
    return int(m["version"]) if m and m["run"] == run_name else None


def base_model_for_adapters(run_name: str, base: str) -> Rewrite:
    """Completion requests for any of the run's adapters go to the base model instead: the adapter
    loads, but nothing samples with it."""

    def rewrite(path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("completions") and adapter_version(str(body.get("model")), run_name) is not None:
            body["model"] = base
        return body

    return rewrite


def previous_version_for(run_name: str, first: int) -> Rewrite:
    """From version `first` on, version N's name is loaded from version N-1's folder: a stale
    adapter served under the newest name."""

    def rewrite(path: str, body: dict[str, Any]) -> dict[str, Any]:
        version = adapter_version(str(body.get("lora_name")), run_name)
        if path == "/v1/load_lora_adapter" and version is not None and version >= first:
            folder = Path(body["lora_path"])
            body["lora_path"] = str(folder.with_name(f"step_{version - 1}"))
        return body

    return rewrite


def zeroed_lora_b_for(run_name: str, first: int, copies: Path) -> Rewrite:
    """From version `first` on, vLLM loads a copy of the adapter folder (in `copies`) whose lora_B
    tensors are zero: written after the trainer's probe logprobs, and equal to the base model."""

    def rewrite(path: str, body: dict[str, Any]) -> dict[str, Any]:
        version = adapter_version(str(body.get("lora_name")), run_name)
        if path == "/v1/load_lora_adapter" and version is not None and version >= first:
            body["lora_path"] = str(zeroed_copy(Path(body["lora_path"]), copies / f"step_{version}"))
        return body

    return rewrite


def zeroed_copy(folder: Path, copy: Path) -> Path:
    """`folder` (a PEFT adapter) copied to `copy`, with every lora_B weight zeroed."""
    if not copy.exists():
        shutil.copytree(folder, copy)
        weights = copy / "adapter_model.safetensors"
        tensors = load_file(weights)
        zeroed = [k for k in tensors if "lora_B" in k]
        assert zeroed, f"no lora_B in {weights}"
        save_file({k: t.zero_() if k in zeroed else t for k, t in tensors.items()}, weights)
    return copy
