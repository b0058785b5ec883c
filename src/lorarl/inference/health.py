"""The one health check of an inference worker: GET /health answers 200.

`rl` waits with it for the workers it started, the orchestrator for the workers it will use, and
the tests for the server they share.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Sequence


def is_healthy(url: str) -> bool:
    """Whether the vLLM server at `url` answers GET /health with 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


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
