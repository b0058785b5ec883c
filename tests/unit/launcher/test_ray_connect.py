"""Reaching a Ray cluster in bounded time and saying in one line what went wrong: an address where
nothing answers, a lost node; and `rl`'s SIGTERM handler kept across `ray.init`."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from lorarl.config.run import RLConfig
from lorarl.launcher.ray_bundles import plan_bundles
from lorarl.launcher.ray_cluster import ClusterError, RayCluster, first_line, init_ray, unreachable
from lorarl.run_folder import RunFolder


def cfg(tmp_path: Path, **cluster: Any) -> RLConfig:
    return RLConfig.model_validate(
        {
            "model": {"name": "m"},
            "output_dir": str(tmp_path),
            "inference": {"api_key": "k"},
            "cluster": {"backend": "ray", **cluster},
        }
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # free again once closed: nothing listens there


def test_an_address_where_nothing_listens_is_unreachable_and_a_listener_is_not() -> None:
    assert unreachable(f"127.0.0.1:{closed_port()}", timeout=5) == "Connection refused"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert unreachable(f"ray://127.0.0.1:{server.getsockname()[1]}", timeout=5) is None


def test_open_stops_in_one_line_before_ray_tries_for_minutes(tmp_path: Path) -> None:
    port = closed_port()
    config = cfg(tmp_path, address=f"127.0.0.1:{port}", connect_timeout=2)
    with pytest.raises(ClusterError) as e:
        RayCluster(config, RunFolder(config.run_dir)).open()
    message = str(e.value)
    assert message.startswith(f"cluster.address 127.0.0.1:{port}: no Ray cluster answers there (Connection refused")
    assert "cluster.connect_timeout = 2 s" in message and "\n" not in message


def test_a_lost_node_is_one_line_that_says_resume_and_promises_no_restart(tmp_path: Path) -> None:
    cluster = RayCluster(cfg(tmp_path), RunFolder(tmp_path / "run"))
    cluster.bundles = plan_bundles(cluster.cfg, gpus=False)
    cluster.nodes = [("a1b2c3d4e5f6" + "0" * 44, "10.0.0.7"), ("f" * 56, "10.0.0.8")]
    dump = "The actor died unexpectedly before finishing this task.\n\tclass_name: ProcessHost\n\tactor_id: 12ab"
    message = cluster._lost(0, RuntimeError(dump))
    assert message.startswith("inference-0: its Ray node a1b2c3d4e5f6 (10.0.0.7) is lost")
    assert "The actor died unexpectedly before finishing this task." in message
    assert "--resume" in message and "restart" not in message and "\n" not in message


def test_first_line_of_an_error() -> None:
    assert first_line(RuntimeError("\n  first\nsecond")) == "first"
    assert first_line(RuntimeError("")) == "RuntimeError"


class Stopped(Exception):
    pass


def rl_handler(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


def ray_like_init(send_sigterm: bool) -> Any:
    """What ray.init does to signals: it installs its own SIGTERM handler (sys.exit), and connecting
    may take a while, during which a SIGTERM can arrive."""

    def init(**_kwargs: Any) -> None:
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
        if send_sigterm:
            signal.raise_signal(signal.SIGTERM)

    return init


@pytest.fixture
def rl_sigterm() -> Any:
    before = signal.signal(signal.SIGTERM, rl_handler)
    yield
    signal.signal(signal.SIGTERM, before)


def test_init_ray_keeps_rls_sigterm_handler(monkeypatch: pytest.MonkeyPatch, rl_sigterm: None) -> None:
    import ray

    monkeypatch.setattr(ray, "init", ray_like_init(send_sigterm=False))
    init_ray("127.0.0.1:6379")
    assert signal.getsignal(signal.SIGTERM) is rl_handler


def test_a_sigterm_while_connecting_reaches_rls_handler(monkeypatch: pytest.MonkeyPatch, rl_sigterm: None) -> None:
    import ray

    monkeypatch.setattr(ray, "init", ray_like_init(send_sigterm=True))
    with pytest.raises(Stopped):
        init_ray(None)
    assert signal.getsignal(signal.SIGTERM) is rl_handler
