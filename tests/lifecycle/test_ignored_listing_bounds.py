"""The ignored-file listing behind archive's `preserve` and `dropped` report is never cut short:
git's output through the bounded runner keeps a head and a tail (64 KiB) and drops the middle, so
with many ignored entries a preserved file listed in the middle was neither saved nor reported, and
went with the checkout (found with the ignored-files copy, which lists the same way)."""

from __future__ import annotations

from pathlib import Path

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create


def test_a_preserved_file_among_many_ignored_entries_is_kept(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = make_repo(
        tmp_short / "repo",
        {".gitignore": "*.log\n*.env\n", ".xum/config.toml": '[scripts]\npreserve = ["*.env"]\n'},
    )
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "many")["workspace"]
    path = Path(ws["path"])
    # ~150 KiB of ignored names: the listing is larger than the runner's 64 KiB output bound.
    for i in range(3000):
        (path / f"ignored-file-number-{i:05d}-with-a-long-name.log").write_text("")
    middle = "ignored-file-number-01500-with-a-long-name.env"  # sorts in the listing's middle
    (path / middle).write_text("TOKEN=precious\n")
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["dropped"]["preserved"] == [middle]
    assert archived["dropped"]["count"] == 3000
    daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert (path / middle).read_text() == "TOKEN=precious\n"
