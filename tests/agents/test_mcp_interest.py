"""Which resources the MCP server's agent listens to (`resources.Interest`): two listen streams
may name one URI, and it stays listened to until the last of them closes; the handshake's
subscriptions stay beside them; after missed events each of them, with the list, changed."""

from __future__ import annotations

from xum_client.mcp.resources import Interest


def test_a_uri_two_streams_name_stays_until_the_last_closes() -> None:
    interest = Interest()
    interest.subscribed.add("xum://a")
    with interest.listening(["xum://b", "xum://c"]):
        with interest.listening(["xum://b"]):
            assert interest.uris() == ["xum://a", "xum://b", "xum://c"]
        assert interest.uris() == ["xum://a", "xum://b", "xum://c"]
    assert interest.uris() == ["xum://a"]
    missed = interest.everything()
    assert missed.uris == ["xum://a"] and missed.list_changed


def test_a_stream_that_fails_gives_its_uris_back() -> None:
    interest = Interest()
    try:
        with interest.listening(["xum://b"]):
            raise RuntimeError("the stream broke")
    except RuntimeError:
        pass
    assert interest.uris() == []
