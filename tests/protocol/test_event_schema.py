"""Typed events: every event a real daemon sends validates against the
typed definition of its type (`xum_protocol.event_types.TYPED_EVENT`, the discriminated union the
JSON Schema carries), driven through a workspace's whole life."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from xum_client import Client
from xum_protocol.event_types import TYPED_EVENTS, typed_event_adapter
from xum_protocol.schema import build_schema

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import make_repo
from tests.support.wait import until

CONFIG = """[scripts]
setup = ["echo set up; echo second line"]
teardown = ["true"]
preserve = [".env"]
"""


@pytest.fixture
def world() -> Iterator[tuple[DaemonProcess, Path]]:
    base = short_tmpdir("xumes-")
    repo = make_repo(
        base / "repo",
        {"README.md": "hi\n", ".gitignore": ".env\n", ".xum/config.toml": CONFIG},
    )
    write_config(base / "root", "[cleanup]\nbackoff_initial_s = 0.01\n")
    daemon = DaemonProcess(base / "root").start()
    try:
        yield daemon, repo
    finally:
        daemon.close()


def _drive(daemon: DaemonProcess, repo: Path) -> None:
    """A workspace's whole life, and a process and a lease in it."""
    project = daemon.call("project.add", {"path": str(repo)})["project"]
    daemon.call("project.trust", {"project_id": project["id"]})
    ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "alpha"})
    workspace = ws["workspace"]
    assert ws["setup"]["status"] == "ok", ws["setup"]
    (Path(workspace["path"]) / ".env").write_text("SECRET=1\n")
    (Path(workspace["path"]) / "work.txt").write_text("unsaved\n")
    renamed = daemon.call("workspace.rename", {"workspace_id": workspace["id"], "name": "beta"})
    assert renamed["workspace"]["name"] == "beta"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lease = daemon.call(
            "lease.acquire",
            {"workspace_id": workspace["id"], "kind": "editor", "pid": sleeper.pid},
        )["lease"]
        daemon.call("lease.release", {"lease_id": lease["id"]})
    finally:
        sleeper.kill()
        sleeper.wait()
    proc = daemon.call(
        "process.spawn",
        {"workspace_id": workspace["id"], "kind": "exec", "argv": ["sh", "-c", "echo hi"]},
    )["process"]
    daemon.call("process.wait", {"process_id": proc["id"], "timeout_s": 30})
    long = daemon.call(
        "process.spawn",
        {"workspace_id": workspace["id"], "kind": "terminal", "argv": ["sleep", "60"]},
    )["process"]
    daemon.call("process.stop", {"process_id": long["id"], "grace_s": 5})
    made = daemon.call(
        "turn.create", {"owner_workspace_id": workspace["id"], "mode": "new", "name": "sub"}
    )
    daemon.call("turn.end", {"handle_id": made["turn"]["id"]})
    daemon.call("workspace.remove", {"workspace_id": made["workspace"]["id"], "force": True})
    auto = daemon.call(
        "workspace.create",
        {"project_id": project["id"], "name": "auto", "auto_archive": "on_agent_exit"},
    )["workspace"]
    daemon.call("process.spawn", {"workspace_id": auto["id"], "kind": "agent", "argv": ["true"]})

    def auto_archived() -> bool:
        info = daemon.call("workspace.get", {"workspace_id": auto["id"]})["workspace"]
        return (info.get("auto_archive_outcome") or {}).get("status") == "archived"

    until(auto_archived, message="the auto-archive to finish")
    daemon.call("workspace.remove", {"workspace_id": auto["id"], "force": True})
    archived = daemon.call("workspace.archive", {"workspace_id": workspace["id"]})
    assert archived["workspace"]["state"] == "archived"
    daemon.call("workspace.unarchive", {"workspace_id": workspace["id"]})
    daemon.call("workspace.remove", {"workspace_id": workspace["id"], "force": True})
    daemon.call("project.remove", {"project_id": project["id"]})


def test_every_event_of_a_workspace_life_validates_against_its_typed_definition(
    world: tuple[DaemonProcess, Path],
) -> None:
    daemon, repo = world
    with Client(daemon.root) as watcher:
        watcher.call("events.subscribe", {})
        _drive(daemon, repo)
        events: list[dict[str, Any]] = []

        def project_removed() -> bool:
            events.append(watcher.next_notification()["params"])
            return events[-1]["type"] == "project.removed"

        until(project_removed, message="project.removed")
    seen = {e["type"] for e in events}
    for event in events:
        assert event["type"] in TYPED_EVENTS, f"no typed definition for {event['type']}"
        try:
            typed = typed_event_adapter().validate_python(event)
        except ValidationError as exc:
            raise AssertionError(f"{event['type']} does not match its definition: {exc}") from None
        assert type(typed) is TYPED_EVENTS[event["type"]]
    # The life above really produced the kinds of events it is meant to check.
    assert {
        "project.added",
        "project.trusted",
        "workspace.created",
        "workspace.updated",
        "workspace.state_changed",
        "workspace.renamed",
        "workspace.removed",
        "script.started",
        "script.printed",
        "lease.acquired",
        "lease.released",
        "process.started",
        "process.exited",
        "process.stopping",
        "turn.created",
        "turn.ended",
        "workspace.auto_archive",
        "cleanup.obligation_changed",
        "project.removed",
    } <= seen, sorted(seen)


def test_a_wrong_data_shape_does_not_validate() -> None:
    """The typed definitions are strict enough to catch a daemon that sends the wrong shape."""
    event = {"seq": 1, "epoch": "e", "at": 0.0, "type": "project.removed", "data": {"name": "p"}}
    with pytest.raises(ValidationError):
        typed_event_adapter().validate_python(event)
    with pytest.raises(ValidationError):
        typed_event_adapter().validate_python({**event, "type": "no.such_type"})
    ok = {**event, "data": {"project_id": "prj_0", "name": "p", "added_later": 1}}
    assert typed_event_adapter().validate_python(ok).data.project_id == "prj_0"


def test_the_schema_carries_the_typed_union_and_every_definition() -> None:
    event = build_schema()["notifications"]["event"]
    typed = event["typed"]
    mapping = typed["discriminator"]["mapping"]
    assert set(mapping) == set(TYPED_EVENTS)
    assert len(typed["oneOf"]) == len(TYPED_EVENTS)
    defs = typed["$defs"]
    for type_, entry in event["types"].items():
        definition = defs[entry["event"]]
        assert mapping[type_] == f"#/$defs/{entry['event']}"
        assert definition["properties"]["type"]["const"] == type_
        assert definition["properties"]["data"]["$ref"] == f"#/$defs/{entry['data']}"
        assert entry["data"] in defs
    # The typed union is a standalone schema: every reference resolves inside it.
    text = json.dumps(typed)
    for ref in {part.split('"')[0] for part in text.split('"$ref": "#/$defs/')[1:]}:
        assert ref in defs, ref


def _validate(event: dict[str, Any]) -> None:
    assert event["type"] in TYPED_EVENTS, f"no typed definition for {event['type']}"
    try:
        typed_event_adapter().validate_python(event)
    except ValidationError as exc:
        raise AssertionError(f"{event['type']} does not match its definition: {exc}") from None


def test_kept_and_adopted_process_events_validate() -> None:
    """process.kept at a stop, process.adopted at the next start: published before any client
    can connect, so the new run's ring replays them (after_seq 0 of the new epoch)."""
    base = short_tmpdir("xumek-")
    repo = make_repo(base / "repo")
    write_config(base / "root", "stop_grace_s = 0.5\n[processes]\nkeep_processes = true\n")
    daemon = DaemonProcess(base / "root").start()
    agent: dict[str, Any] = {}
    try:
        project = daemon.call("project.add", {"path": str(repo)})["project"]
        ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "k"})
        agent = daemon.call(
            "process.spawn",
            {"workspace_id": ws["workspace"]["id"], "kind": "agent", "argv": ["sleep", "60"]},
        )["process"]
        with Client(daemon.root, timeout=30) as watcher:
            watcher.call("events.subscribe", {"types": ["process."]})
            daemon.call("daemon.shutdown")
            kept = watcher.next_notification()["params"]
        assert kept["type"] == "process.kept"
        _validate(kept)
        assert daemon.wait(30) == 0
        daemon.start()
        with Client(daemon.root) as client:
            epoch = client.server["epoch"] if client.server else ""
            replay = client.call("events.subscribe", {"after_seq": 0, "epoch": epoch})
        assert replay["resync_required"] is False
        adopted = [e for e in replay["events"] if e["type"] == "process.adopted"]
        assert [e["data"]["process"]["id"] for e in adopted] == [agent["id"]]
        for event in replay["events"]:
            _validate(event)
        daemon.call("process.stop", {"process_id": agent["id"], "grace_s": 1})
    finally:
        daemon.close()
