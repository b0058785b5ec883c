"""The orchestrator's check of inference.urls: a server that answers and is not vLLM serving model.name
stops it (exit code 2, one line); one where nothing answers yet is waited for, unless `strict` (after
the wait)."""

from __future__ import annotations

import pytest

from lorarl.config.run import RLConfig
from lorarl.orchestrator.orchestrator import check_given_servers
from tests.conftest import free_port
from tests.unit.inference.fake_vllm import FakeVLLM


def config(url: str, model: str = "/models/tiny") -> RLConfig:
    return RLConfig.model_validate({"model": {"name": model}, "inference": {"urls": [url]}})


def test_a_server_of_another_model_stops_the_orchestrator(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeVLLM("/models/other") as server:
        check = config(server.url)
        for strict in (False, True):
            with pytest.raises(SystemExit) as stopped:
                check_given_servers(check, strict)
            assert stopped.value.code == 2
            assert capsys.readouterr().err == (
                f"error: inference.urls: {server.url} serves /models/other, not model.name /models/tiny (the same "
                "model at another path: start the server with --served-model-name /models/tiny)\n"
            )
        check_given_servers(config(server.url, "/models/other"), strict=True)  # its own model passes


def test_a_server_not_answering_yet_is_waited_for_unless_strict(capsys: pytest.CaptureFixture[str]) -> None:
    closed = config(f"http://127.0.0.1:{free_port()}")
    check_given_servers(closed, strict=False)
    with pytest.raises(SystemExit):
        check_given_servers(closed, strict=True)
    assert "nothing usable answers at" in capsys.readouterr().err
