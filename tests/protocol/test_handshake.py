"""The handshake: optional, version-negotiated, with a clear mismatch error."""

from __future__ import annotations

import pytest
from xum_client import Client
from xum_client.errors import ProtocolMismatch

from tests.support.daemon import DaemonProcess
from tests.support.raw import RawPeer, exchange


def hello(protocol: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "method": "hello",
        "params": {"protocol": protocol, "client": {"name": "test", "version": "0"}},
        "id": 1,
    }


def test_hello_answers_protocol_server_root_capabilities(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send_json(hello("1.0"))
        result = peer.read()["result"]
    assert result["protocol"] == "1.5"
    assert result["server"]["name"] == "xumd" and result["server"]["version"]
    assert result["root"] == str(daemon.root)
    assert {"hello", "daemon.status", "daemon.shutdown", "events.subscribe"} <= set(
        result["capabilities"]
    )


def test_newer_minor_of_the_same_major_is_compatible(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send_json(hello("1.7"))
        assert peer.read()["result"]["protocol"] == "1.5"


@pytest.mark.parametrize("version", ["2.0", "0.9", "3"])
def test_other_major_is_a_protocol_mismatch_naming_versions(
    daemon: DaemonProcess, version: str
) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send_json(hello(version))
        error = peer.read()["error"]
        assert error["code"] == -32009
        assert error["data"]["kind"] == "protocol_mismatch"
        assert error["data"]["server_protocols"] == ["1.5"]
        assert error["data"]["client_protocol"] == version
        assert version in error["message"] and "1.5" in error["message"]
        # The connection stays usable: the client may retry with a version we speak.
        peer.send_json(hello("1.0"))
        assert peer.read()["result"]["protocol"] == "1.5"


@pytest.mark.parametrize("version", ["one", "1.0.0", "", "1.x"])
def test_malformed_version_is_invalid_params(daemon: DaemonProcess, version: str) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send_json(hello(version))
        assert peer.read()["error"]["code"] == -32602


def test_no_hello_needed(daemon: DaemonProcess) -> None:
    answers = exchange(
        daemon.socket_path, '{"jsonrpc": "2.0", "method": "daemon.status", "id": "x"}\n'
    )
    assert answers[0]["result"]["root"] == str(daemon.root)


def test_client_handshake_and_typed_mismatch(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Client(daemon.root) as client:
        assert client.server is not None and client.server["protocol"] == "1.5"
    monkeypatch.setattr("xum_client.sync.PROTOCOL_VERSION", "2.0")
    with pytest.raises(ProtocolMismatch) as caught:
        Client(daemon.root)
    assert caught.value.kind == "protocol_mismatch"
    assert caught.value.data["server_protocols"] == ["1.5"]
