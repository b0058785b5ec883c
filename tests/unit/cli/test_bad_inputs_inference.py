"""Bad input about the inference servers: inference.urls naming something that is not a vLLM server
serving model.name (a plain HTTP server, a closed port, a server that never answers, another model, a
wrong key, a url with a path or the wrong scheme), and out-of-range request timeouts and worker
settings, given to `rl --dry-run`, `lorarl-orchestrator` run alone and `lorarl-inference`. Each is refused within
seconds with exit code 2 and one line naming the key and url at fault, no traceback, nothing written
(see `bad_inputs.assert_refused`). The servers are real sockets on loopback: Python's http.server for
the servers that are not vLLM, the loopback vLLM stand-in of the inference unit tests for the vLLM
ones.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import free_port
from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, rl_args
from tests.unit.inference.fake_vllm import FakeVLLM

# Each server's url, by name, once the module's fixture has started them.
URLS: dict[str, str] = {}


class Answers(http.server.BaseHTTPRequestHandler):
    """A server that is not vLLM: answers GET `path` with `body` (200) and anything else with 404."""

    routes: dict[str, tuple[int, bytes]] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass  # no request lines on stderr: the cases read it


def answering(routes: dict[str, tuple[int, bytes]]) -> type[Answers]:
    return type("Routes", (Answers,), {"routes": routes})


class Files(http.server.SimpleHTTPRequestHandler):
    """`python -m http.server` (404 at /health), without its request lines on stderr."""

    log_message = Answers.log_message


NOT_VLLM = {
    "files": Files,
    "health_ok": answering({"/health": (200, b"OK")}),  # a health check of another kind
    "engine_dead": answering({"/health": (503, b"")}),
    "models_html": answering({"/health": (200, b""), "/v1/models": (200, b"<html>models</html>")}),
    "models_other_vendor": answering({"/health": (200, b""), "/v1/models": (
        200, b'{"object": "list", "data": [{"id": "gpt-4o", "object": "model", "owned_by": "openai"}]}')}),
    "models_none": answering({"/health": (200, b""), "/v1/models": (200, b'{"object": "list", "data": []}')}),
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def servers(ws: Workspace) -> Iterator[None]:
    """Every server of the cases, on loopback, for the module's duration."""
    started = []
    for name, handler in NOT_VLLM.items():
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        URLS[name] = f"http://127.0.0.1:{server.server_address[1]}"
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    URLS["silent"] = f"http://127.0.0.1:{silent.getsockname()[1]}"
    URLS["closed"] = f"http://127.0.0.1:{free_port()}"
    with (
        FakeVLLM(str(ws.model)) as right,
        FakeVLLM(str(ws.root / "other-model")) as other,
        FakeVLLM(str(ws.model), api_key="the-servers-key") as keyed,
    ):
        URLS.update(right=right.url, other=other.url, keyed=keyed.url)
        yield
    silent.close()
    for server in started:
        server.shutdown()


def urls(*names: str) -> str:
    """The --inference.urls value for servers `names`, read when the case runs; `name/path` adds a path."""
    return "[" + ", ".join(f'"{URLS[n.split("/")[0]]}{n[len(n.split("/")[0]) :]}"' for n in names) + "]"


def rl_urls(*names: str, extra: tuple[str, ...] = ()) -> Callable[[Workspace], list[str]]:
    return lambda w: rl_args("--inference.urls", urls(*names), *extra)(w)


def https(name: str) -> Callable[[Workspace], list[str]]:
    return lambda w: rl_args("--inference.urls", URLS[name].replace("http://", "https://"))(w)


def alone(*args: str, server: str | None = None) -> Callable[[Workspace], list[str]]:
    """`lorarl-orchestrator` run alone in the workspace's finished run folder (one lorarl prepared)."""
    return lambda w: ["--model.name", str(w.model), "--output_dir", str(w.out), "--run_name", "previous",
                      *(["--inference.urls", urls(server)] if server else []), *args]  # fmt: skip


def inference_args(*args: str) -> Callable[[Workspace], list[str]]:
    return lambda w: ["--model.name", str(w.model), "--dry-run", *args]


NOT_A_VLLM = "is not a vLLM server"
POSITIVE, FINITE = "Input should be greater than 0", "Input should be a finite number"
A_SECOND = "Input should be greater than or equal to 1"  # a wait's floor (config.common.MIN_WAIT)
CASES: list[Case] = [
    # inference.urls: something else answers there, or nothing does.
    ("rl", rl_urls("files"), "/health answered HTTP 404: not a usable vLLM server"),
    ("rl", rl_urls("health_ok"), f"{NOT_A_VLLM} (its /health answers b'OK')"),
    ("rl", rl_urls("engine_dead"), "/health answered HTTP 503"),
    ("rl", rl_urls("models_html"), f"{NOT_A_VLLM} (its /v1/models answers b'<html>"),
    ("rl", rl_urls("models_other_vendor"), f"{NOT_A_VLLM} (its /v1/models answers"),
    ("rl", rl_urls("closed"), "inference.urls: nothing usable answers at http://127.0.0.1:"),
    ("rl", rl_urls("silent"), "timed out"),
    ("rl", https("right"), "inference.urls: nothing usable answers at https://127.0.0.1:"),
    ("rl", rl_urls("right/v1"), "/v1/health answered HTTP 404"),  # the OpenAI base url, not the server's
    # vLLM, but not serving this run's model, or not to us.
    ("rl", rl_urls("other"), "other-model, not model.name"),
    ("rl", rl_urls("models_none"), "serves no base model, not model.name"),
    ("rl", rl_urls("keyed"), "/v1/models answered HTTP 401 (inference.api_key)"),
    ("rl", rl_urls("keyed", extra=("--inference.api_key", "not-the-key")), "answered HTTP 401 (inference.api_key)"),
    ("rl", rl_urls("right", "closed"), "nothing usable answers at"),  # the second of two
    # The orchestrator run alone checks them as rl does, before it writes anything (a url where nothing
    # answers yet it waits for: under `rl`, a server may be restarting when the orchestrator is).
    ("lorarl-orchestrator", alone(server="files"), "/health answered HTTP 404"),
    ("lorarl-orchestrator", alone(server="other"), "other-model, not model.name"),
    ("lorarl-orchestrator", alone(server="models_other_vendor"), f"{NOT_A_VLLM} (its /v1/models answers"),
    ("lorarl-orchestrator", alone("--inference.request_timeout", "-30"), f"inference.request_timeout: {A_SECOND}"),
    # Request timeouts and the slowest generation expected of a worker.
    ("rl", rl_args("--inference.request_timeout", "0"), f"inference.request_timeout: {A_SECOND}"),
    ("rl", rl_args("--inference.request_timeout", "inf"), f"inference.request_timeout: {FINITE}"),
    ("rl", rl_args("--inference.min_tokens_per_s", "0"), f"inference.min_tokens_per_s: {POSITIVE}"),
    ("rl", rl_args("--inference.min_tokens_per_s", "nan"), f"inference.min_tokens_per_s: {FINITE}"),
    (
        "lorarl-inference",
        inference_args("--inference.min_tokens_per_s", "fast"),
        "min_tokens_per_s: Input should be a valid",
    ),
    ("rl", rl_args("--inference.unavailable_timeout", "0"), f"inference.unavailable_timeout: {A_SECOND}"),
    ("lorarl-inference", inference_args("--inference.startup_timeout", "-1"), f"inference.startup_timeout: {A_SECOND}"),
    ("rl", rl_args("--inference.max_restarts", "-1"), "inference.max_restarts: Input should be greater than or"),
    # Worker settings of `lorarl-inference`.
    (
        "lorarl-inference",
        inference_args("--inference.tensor_parallel_size", "0"),
        "inference.tensor_parallel_size: Input",
    ),
    ("lorarl-inference", inference_args("--inference.gpu_memory_utilization", "1.5"), "gpu_memory_utilization: Input"),
    ("lorarl-inference", inference_args("--inference.cpu_threads", "0"), "inference.cpu_threads: Input"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "args", "names"), CASES, ids=case_ids(CASES))
def test_bad_inference_input_is_refused_in_one_line_within_seconds(
    ws: Workspace, capsys: pytest.CaptureFixture[str], command: str, args: Callable[[Workspace], list[str]], names: str
) -> None:
    start = time.monotonic()
    assert_refused(ws, capsys, command, args(ws), names)
    assert time.monotonic() - start < 20  # a url is named in seconds (5 s for one that never answers)


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_a_vllm_server_of_the_model_passes(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    """The same check lets the right server through: the cases above fail for their fault alone."""
    from lorarl.inference.health import check_served_model

    check_served_model(URLS["right"], str(ws.model))
    check_served_model(URLS["keyed"], str(ws.model), "the-servers-key")
