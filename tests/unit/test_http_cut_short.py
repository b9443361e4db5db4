"""An answer cut short (vmctld killed while it writes one) leaves no socket open: the CLI's client and the
agents' connection close the response that holds it at once, not when the garbage collector finds it
(under ``-W error`` that was a ``ResourceWarning`` failing whichever test ran then: the kill -9 test)."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from vmctl import errors


@pytest.fixture
def cut_server() -> Iterator[int]:
    """A server on loopback that answers headers and part of a body (``Connection: close``), then resets
    the connection while the client reads the rest."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        while True:  # every connection (the agents' retries once after a reset) until the socket closes
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(65536)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
                      b"Connection: close\r\n\r\n{\"a\": ")
            time.sleep(0.2)  # order, not a measurement: the client reads the headers before the reset
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    srv.shutdown(socket.SHUT_RDWR)  # wakes the accept
    srv.close()
    t.join(30)


@pytest.fixture
def responses(monkeypatch: pytest.MonkeyPatch) -> list[http.client.HTTPResponse]:
    seen: list[http.client.HTTPResponse] = []
    orig = http.client.HTTPConnection.getresponse

    def record(self: http.client.HTTPConnection) -> http.client.HTTPResponse:
        r = orig(self)
        seen.append(r)
        return r

    monkeypatch.setattr(http.client.HTTPConnection, "getresponse", record)
    return seen


def test_the_cli_client_closes_a_response_cut_short(cut_server: int,
                                                    responses: list[http.client.HTTPResponse]) -> None:
    from vmctl.apiclient import ApiClient

    with pytest.raises(errors.DaemonUnavailable):
        ApiClient(f"http://127.0.0.1:{cut_server}", "token").raw("GET", "/v1/health")
    assert responses and all(r.fp is None for r in responses)  # closed: its socket with it


def test_the_agents_connection_closes_a_response_cut_short(cut_server: int, monkeypatch: pytest.MonkeyPatch,
                                                           responses: list[http.client.HTTPResponse]) -> None:
    from vmctl.agents import http_source
    from vmctl.agents.http_source import AgentEndpoint

    # plain HTTP to the loopback server: the TLS set-up is not what is tested here
    monkeypatch.setattr(AgentEndpoint, "ssl_context", lambda self: None)
    monkeypatch.setattr(AgentEndpoint, "stamp", lambda self: ())

    def plain(host: str, port: int, context: Any = None, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(host, port, timeout=timeout)

    monkeypatch.setattr(http_source.http.client, "HTTPSConnection", plain)
    conn = http_source._Conn(AgentEndpoint(url=f"https://127.0.0.1:{cut_server}", node="n1", cert_file="c",
                                           key_file="k", ca_file="ca"))
    with pytest.raises(errors.DaemonUnavailable):
        conn.request("POST", "/v1/agent/nodes/n1/heartbeat", {})
    assert responses and all(r.fp is None for r in responses)
