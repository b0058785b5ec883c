"""`check_served_model`: a url of inference.urls must be vLLM's OpenAI server serving model.name; anything
else is named in one line within seconds (a vLLM stand-in, a plain HTTP server, a closed port)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorarl.inference.health import ServerCheckError, check_served_model
from tests.conftest import free_port
from tests.unit.inference.fake_vllm import FakeVLLM


@pytest.fixture
def plain_http(tmp_path: Path) -> Iterator[str]:
    """Python's file server, which answers /health with 404 and / with a listing."""
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def refused(url: str, model: str, timeout: float = 5.0) -> str:
    start = time.monotonic()
    with pytest.raises(ServerCheckError) as e:
        check_served_model(url, model, timeout=timeout)
    assert time.monotonic() - start < timeout + 3
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_vllm_server_of_the_model_passes_by_name_or_by_folder(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    (tmp_path / "link").symlink_to(model)
    with FakeVLLM(str(model)) as server:
        check_served_model(server.url, str(model))
        check_served_model(server.url, str(tmp_path / "link"))  # the same folder, spelled otherwise


def test_a_vllm_server_of_another_model_is_named(tmp_path: Path) -> None:
    with FakeVLLM("/models/other") as server:
        message = refused(server.url, str(tmp_path / "tiny"))
    assert message == (f"inference.urls: {server.url} serves /models/other, not model.name {tmp_path / 'tiny'} "
                       f"(the same model at another path: start the server with --served-model-name "
                       f"{tmp_path / 'tiny'})")  # fmt: skip


def test_a_server_that_is_not_vllm_is_named(plain_http: str) -> None:
    assert refused(plain_http, "/m") == (
        f"inference.urls: {plain_http}/health answered HTTP 404: not a usable vLLM server"
    )


def test_a_closed_port_is_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert refused(url, "/m").startswith(f"inference.urls: nothing usable answers at {url} (")


def test_a_server_that_never_answers_is_named_after_the_timeout() -> None:
    with FakeVLLM("/m") as server:
        server.frozen.set()
        assert "timed out" in refused(server.url, "/m", timeout=0.5)
