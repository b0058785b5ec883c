"""`rl`'s port check refuses a port that a socket holds, not one that a stopped server's connections
linger on (TIME_WAIT), which vLLM's server binds anyway: recipes run one after another on one port."""

import socket

import pytest

from lorarl.launcher.preflight import PreflightError, check_ports


def test_a_port_with_a_listener_is_refused_and_one_left_in_time_wait_is_not() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    with pytest.raises(PreflightError, match=f"inference.port: 127.0.0.1:{port} is not free"):
        check_ports("127.0.0.1", port, 1)

    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the connection stays in TIME_WAIT
    server.close()
    client.close()
    with socket.socket() as plain, pytest.raises(OSError):  # what the check did before: a plain bind
        plain.bind(("127.0.0.1", port))
    check_ports("127.0.0.1", port, 1)
