"""The one health check of an inference worker: GET /health answers 200; and what a server given
by inference.urls must be before a run uses it: vLLM, serving model.name.

`rl` waits with `wait_until_healthy` for the workers it started, the orchestrator for the workers it
will use, and the tests for the server they share. `check_served_model` runs before: a url where
something else answers (another HTTP server, a closed port) would otherwise be waited on for
inference.startup_timeout in silence, and a vLLM serving another base model trains an adapter for
the wrong model with nothing to show for it but a logprob gap.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CHECK_TIMEOUT = 5.0  # seconds for each request of `check_served_model`: a vLLM answers both at once


class ServerCheckError(ValueError):
    """A url of inference.urls is not a vLLM server serving model.name; str() is one line. `answered`:
    something answered there (False: refused, or timed out: a server that may still be starting)."""

    def __init__(self, message: str, answered: bool = True) -> None:
        super().__init__(message)
        self.answered = answered


def is_healthy(url: str) -> bool:
    """Whether the vLLM server at `url` answers GET /health with 200."""
    return health_problem(url) is None


def health_problem(url: str, timeout: float = 2.0) -> OSError | None:
    """None if the server at `url` answers GET /health with 200 within `timeout` seconds; else what went
    wrong: a TimeoutError if it did not answer in time."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return None if resp.status == 200 else OSError(f"/health answered {resp.status}")
    except OSError as e:
        reason = getattr(e, "reason", None)  # urllib wraps a timeout while connecting in a URLError
        return reason if isinstance(reason, TimeoutError) else e


def wait_until_healthy(
    urls: Sequence[str], timeout: float, alive: Callable[[], bool] = lambda: True, poll: float = 0.5
) -> None:
    """Poll every url until all are healthy. Raises TimeoutError after `timeout` seconds, and
    RuntimeError as soon as `alive()` says the servers' processes have died."""
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending := [u for u in pending if not is_healthy(u)]:
        if not alive():
            raise RuntimeError(f"inference at {', '.join(pending)} exited before it became healthy")
        if time.monotonic() > deadline:
            raise TimeoutError(f"inference at {', '.join(pending)} not healthy after {timeout:.0f} s")
        time.sleep(poll)


def check_served_model(url: str, model: str, api_key: str | None = None, timeout: float = CHECK_TIMEOUT) -> None:
    """Raise ServerCheckError unless the server at `url` looks like vLLM's OpenAI server (GET /health:
    200 with an empty body; GET /v1/models: vLLM's model list) and serves `model` as its base model
    (its id or root, the --model it was started with)."""
    health = _get(url, "/health", None, timeout)
    if health != b"":
        raise ServerCheckError(f"inference.urls: {url} is not a vLLM server (its /health answers {health[:60]!r})")
    bases = [m for m in _model_list(url, api_key, timeout) if not m["parent"]]
    if not any(_same_model(model, m) for m in bases):
        served = ", ".join(str(m.get("root") or m["id"]) for m in bases) or "no base model"
        raise ServerCheckError(
            f"inference.urls: {url} serves {served}, not model.name {model} (the same model at another path: "
            f"start the server with --served-model-name {model})"
        )


def _model_list(url: str, api_key: str | None, timeout: float) -> list[dict[str, Any]]:
    """The entries of the server's GET /v1/models; ServerCheckError unless it is vLLM's list."""
    body = _get(url, "/v1/models", api_key, timeout)
    try:
        listed = json.loads(body)["data"]
        if all(m["object"] == "model" and m["owned_by"] == "vllm" and "parent" in m for m in listed):
            return list(listed)
    except (ValueError, KeyError, TypeError):  # not JSON, or not shaped as vLLM's
        pass
    raise ServerCheckError(f"inference.urls: {url} is not a vLLM server (its /v1/models answers {body[:60]!r})")


def _get(url: str, path: str, api_key: str | None, timeout: float) -> bytes:
    """The body of GET url+path, which must answer 200; else ServerCheckError."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=timeout) as resp:
            return bytes(resp.read(1 << 20))
    except urllib.error.HTTPError as e:
        hint = " (inference.api_key)" if e.code in (401, 403) else ""
        raise ServerCheckError(
            f"inference.urls: {url}{path} answered HTTP {e.code}{hint}: not a usable vLLM server"
        ) from None
    except (OSError, ValueError) as e:  # refused, timed out, not HTTP, a malformed url
        reason = getattr(e, "reason", None) or e
        raise ServerCheckError(f"inference.urls: nothing usable answers at {url} ({reason})", answered=False) from None


def _same_model(model: str, served: dict[str, Any]) -> bool:
    """Whether the served base model (vLLM's id and root) is `model`: the same name, or the same folder."""
    names = {served.get("id"), served.get("root")} - {None}
    if model in names:
        return True
    here = Path(model).expanduser()
    return here.exists() and any(Path(str(n)).expanduser().resolve() == here.resolve() for n in names)
