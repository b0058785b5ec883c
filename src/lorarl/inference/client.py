"""Async client for one vLLM OpenAI-compatible server: the calls the orchestrator makes.

A request that fails because of the server (connection refused or lost, a timeout, HTTP 5xx)
raises `WorkerUnavailable`, so that the pool (pool.py) can route it elsewhere; a request the
server rejects (HTTP 4xx) raises `InferenceError` (`RequestRefused`, with the status and vLLM's
message, from the calls that read a JSON answer).

A request's timeout follows the work asked for: `timeout` seconds for anything (queueing, prefill,
an adapter load), plus max_tokens / `tokens_per_s` for a generation, so that a long generation is
not cut short and a frozen server is noticed (`WorkerStalled`) about as soon as a healthy one
would have answered. A fixed timeout (600 s) let one frozen worker of two stall a run for 10 min.

An adapter name is claimed on a server by loading it: vLLM refuses a second load of a name it
serves (under a per-name lock), and the client never silently replaces it (`AdapterNameTaken`):
the caller decides whether that adapter is its own (adapters.py).

Uses one aiohttp session per worker: measured on the tiny model (docs/vllm.md), a long-lived
httpx.AsyncClient slowed concurrent batches 4-10x; aiohttp did not.
"""

from __future__ import annotations

import asyncio
import json as json_lib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from lorarl.model_shapes import FUSED_EXPERT_LORA

# The server closes idle keep-alive connections after 5 s: a request racing that close fails with
# a disconnect, and is safe to send again.
_RETRYABLE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


log = logging.getLogger("lorarl.inference")


def fused_expert_lora(folder: str) -> bool:
    """Whether the adapter in `folder` (as this machine sees it) holds PEFT's fused MoE expert LoRA,
    which vLLM reads only when the load request says is_3d_lora_weight (docs/moe.md)."""
    config = Path(folder) / "adapter_config.json"
    if not config.is_file():
        return False  # the server names what is wrong with the folder
    targets = json_lib.loads(config.read_text()).get("target_parameters") or []
    return any(t.rpartition(".")[2] in FUSED_EXPERT_LORA for t in targets)


class InferenceError(RuntimeError):
    """The server answered, and refused the request."""


class RequestRefused(InferenceError):
    """The server answered with an HTTP error (4xx) to a request it understood: `status`, and vLLM's
    error message and the parameter it names, where its answer has them."""

    def __init__(self, line: str, status: int, message: str, param: str | None) -> None:
        super().__init__(line)
        self.status, self.message, self.param = status, message, param

    @classmethod
    def from_answer(cls, line: str, status: int, text: str) -> RequestRefused:
        try:
            error = json_lib.loads(text)["error"]
            return cls(line, status, str(error["message"]), error.get("param"))
        except (ValueError, KeyError, TypeError):  # not vLLM's JSON error: the text as it came
            return cls(line, status, text[:500], None)


class WorkerUnavailable(InferenceError):
    """The server did not answer: it is down, restarting, overloaded or broken."""


class WorkerStalled(WorkerUnavailable):
    """The server took longer than the request's timeout: frozen, or far slower than expected."""


class AdapterNameTaken(InferenceError):
    """The server already serves an adapter of that name, loaded from `root`."""

    def __init__(self, base_url: str, name: str, root: str | None) -> None:
        super().__init__(f"{base_url} already serves an adapter named {name} (from {root})")
        self.base_url, self.name, self.root = base_url, name, root


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


class InferenceClient:
    """One vLLM server. `in_flight` counts requests not yet answered (for its busy time)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        retries: int = 3,
        api_key: str | None = None,
        run_dirs: tuple[str, str] | None = None,
        tokens_per_s: float | None = None,
    ) -> None:
        """`timeout`: seconds any request may take; a generation gets max_tokens / `tokens_per_s` more
        (None: nothing more)."""
        self.base_url = base_url.rstrip("/")
        # (the run folder here, the same folder on the server's machine): adapter paths are sent as the latter.
        self.run_dirs = run_dirs
        self.in_flight = 0
        # Adapter names loaded through this client (the pool resets it from /v1/models after an outage).
        self.adapters: set[str] = set()
        # Seconds with at least one completion request in flight: the worker's busy time.
        self.busy_seconds = 0.0
        self._busy_since = 0.0
        self.timeout, self.tokens_per_s = timeout, tokens_per_s
        self._retries = retries
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def timeout_for(self, json: dict[str, Any] | None) -> float:
        """Seconds the request with body `json` may take: more for more tokens to generate."""
        max_tokens = (json or {}).get("max_tokens") or 0
        return self.timeout + (max_tokens / self.tokens_per_s if self.tokens_per_s else 0.0)

    async def _request(self, method: str, path: str, json: dict[str, Any] | None = None) -> tuple[int, str]:
        seconds = self.timeout_for(json)
        timeout = aiohttp.ClientTimeout(total=seconds)
        for attempt in range(self._retries + 1):
            try:
                async with self.session.request(method, self.base_url + path, json=json, timeout=timeout) as resp:
                    status, text = resp.status, await resp.text()
            except TimeoutError as e:
                raise WorkerStalled(f"{method} {self.base_url}{path}: no answer within {seconds:.1f} s") from e
            except _RETRYABLE as e:
                if attempt == self._retries:
                    raise WorkerUnavailable(f"{method} {self.base_url}{path}: {e!r}") from e
                await asyncio.sleep(0.1 * 2**attempt)
                continue
            except aiohttp.ClientError as e:
                raise WorkerUnavailable(f"{method} {self.base_url}{path}: {e!r}") from e
            if status >= 500:
                raise WorkerUnavailable(f"{method} {self.base_url}{path} -> {status}: {text[:300]}")
            return status, text
        raise AssertionError("unreachable")

    async def _json(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        status, text = await self._request(method, path, json)
        if status != 200:
            raise RequestRefused.from_answer(f"{method} {self.base_url}{path} -> {status}: {text[:500]}", status, text)
        return json_lib.loads(text)

    async def models(self) -> list[dict[str, Any]]:
        return list((await self._json("GET", "/v1/models"))["data"])

    def _server_path(self, path: str) -> str:
        """`path` (in the run folder) as the server's machine sees it."""
        if self.run_dirs is not None and path.startswith(self.run_dirs[0]):
            return self.run_dirs[1] + path[len(self.run_dirs[0]) :]
        return path

    async def load_adapter(self, name: str, path: str, replace: bool = False) -> None:
        """Load the adapter in folder `path` as `name`. A name the server already serves raises
        `AdapterNameTaken`, unless `replace` (the caller knows that adapter is its own, or its run ended)."""
        fused = fused_expert_lora(path)  # read here, where `path` is this machine's
        path = self._server_path(path)
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if fused:  # PEFT's fused layout, which vLLM reads with --enable-mixed-moe-lora-format
            body["is_3d_lora_weight"] = True
        status, text = await self._request("POST", "/v1/load_lora_adapter", body)
        if status == 400 and "already been loaded" in text:
            if not replace:
                root = next((m.get("root") for m in await self.models() if m["id"] == name), None)
                raise AdapterNameTaken(self.base_url, name, root)
            log.warning("%s already serves an adapter named %s; replacing it with %s", self.base_url, name, path)
            await self.unload_adapter(name)
            status, text = await self._request("POST", "/v1/load_lora_adapter", body)
        if status != 200:
            raise InferenceError(f"loading adapter {name} from {path} into {self.base_url}: {status} {text[:300]}")
        self.adapters.add(name)

    async def unload_adapter(self, name: str) -> None:
        status, text = await self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if status not in (200, 404):  # 404: already gone, which is what we wanted
            raise InferenceError(f"unloading adapter {name} from {self.base_url}: {status} {text[:300]}")
        self.adapters.discard(name)

    async def reload_weights(self, path: str) -> None:
        """Full fine-tuning: make the server's model the one in folder `path`, in place (weight_reload.py),
        then drop its prefix cache, the running requests' included, so that no KV computed with the old
        weights is reused: those requests continue on the new weights."""
        body = {"method": "reload_policy", "kwargs": {"weights_path": self._server_path(path)}}
        try:
            await self._json("POST", "/collective_rpc", body)
            reset = await self._json("POST", "/reset_prefix_cache?reset_running_requests=true")
        except WorkerUnavailable:
            raise
        except InferenceError as e:
            raise InferenceError(
                f"reloading the weights of {path}: {e} (a server for model.full_finetune must be started by "
                "rl or inference from a config that sets it)"
            ) from None
        if not reset.get("success"):
            raise InferenceError(f"{self.base_url} did not reset its prefix cache after reloading {path}: {reset}")

    async def chat(self, model: str, messages: list[dict[str, str]], **params: Any) -> str:
        """The reply to a chat (OpenAI /v1/chat/completions, the server applying the chat template),
        e.g. a judge's grade; `params` are further request fields (max_tokens, temperature, ...)."""
        data = await self._json("POST", "/v1/chat/completions", {"model": model, "messages": messages, **params})
        return str(data["choices"][0]["message"]["content"] or "")

    async def prompt_logprobs(self, model: str, prompt_ids: list[int]) -> list[float]:
        """log p(token | tokens before it) of each prompt token but the first, as the server scores
        them with `model` (vLLM's prompt_logprobs; one token generated, not read)."""
        body = {"model": model, "prompt": prompt_ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        scored = (await self._json("POST", "/v1/completions", body))["choices"][0]["prompt_logprobs"][1:]
        return [float(entry[str(token)]["logprob"]) for entry, token in zip(scored, prompt_ids[1:], strict=True)]

    async def complete(
        self,
        model: str,
        prompt_ids: list[int],
        n: int,
        temperature: float,
        top_p: float,
        max_tokens: int,
        **extra: Any,
    ) -> list[Completion]:
        """`n` samples for one tokenized prompt, as token ids with their logprobs (no re-tokenizing);
        `extra`: further request fields (vLLM's `structured_outputs`, `stop`, ...)."""
        body = {
            **extra,
            "model": model,
            "prompt": prompt_ids,
            "n": n,
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "logprobs": 0,
            "return_token_ids": True,
        }
        choices = sorted((await self.completions(body))["choices"], key=lambda c: c["index"])
        return [
            Completion(c["token_ids"], c["logprobs"]["token_logprobs"], c["text"], c["finish_reason"]) for c in choices
        ]

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's answer to /v1/completions with `body` as it is, the time it takes counted as busy."""
        if self.in_flight == 0:
            self._busy_since = time.monotonic()
        self.in_flight += 1
        try:
            return dict(await self._json("POST", "/v1/completions", body))
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.busy_seconds += time.monotonic() - self._busy_since
