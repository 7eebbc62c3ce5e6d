// A subscription's snapshot on a root larger than one page (protocol 1.3, `snapshot_limit`): the
// client fetches the snapshot's workspaces page by page on the subscribed connection and emits
// it whole; events published between two pages are neither lost nor left half-applied.

import assert from "node:assert/strict";
import { once } from "node:events";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import {
  ConnectionLost,
  XumClient,
  iterWorkspaces,
  type ClientOptions,
  type RawEvent,
  type SnapshotConn,
  type WorkspaceInfo,
} from "../src/index.js";
import { Daemon, makeRepo, populate, shortTmpdir, until, withDaemon } from "./support/daemon.js";

const COUNT = 1203;

/** A client that counts the snapshot's pages and may act before each. */
class PagingClient extends XumClient {
  pages: string[] = [];
  beforePage: ((n: number) => Promise<void>) | null = null;

  constructor(options: ClientOptions) {
    super(options);
  }

  protected override async snapshotPage(
    conn: SnapshotConn,
    after: string,
    limit: number,
  ): Promise<Record<string, unknown>> {
    this.pages.push(after);
    if (this.beforePage !== null) await this.beforePage(this.pages.length);
    return super.snapshotPage(conn, after, limit);
  }
}

async function withBigRoot(fn: (daemon: Daemon) => Promise<void>): Promise<void> {
  const tmp = shortTmpdir();
  const daemon = new Daemon(join(tmp, "r"));
  try {
    populate(daemon.root, COUNT);
    await daemon.start();
    await fn(daemon);
  } finally {
    await daemon.close();
    rmSync(tmp, { recursive: true, force: true });
  }
}

function ids(list: unknown): string[] {
  return (list as WorkspaceInfo[]).map((w) => w.id);
}

test("the snapshot of a root larger than a page comes in pages, whole, under a frame cap the whole would pass", async () => {
  await withBigRoot(async (daemon) => {
    const lister = await XumClient.connect({ socketPath: daemon.socketPath });
    const full: string[] = [];
    try {
      for await (const w of iterWorkspaces(lister)) full.push(w.id);
    } finally {
      await lister.close();
    }
    assert.equal(full.length, COUNT);
    // A cap above one page of 500 but below the whole: only a paged snapshot fits.
    const whole = await XumClient.connect({ socketPath: daemon.socketPath, reconnect: false });
    let wholeBytes = 0;
    try {
      const info = await whole.subscribe({ snapshotPage: 0 });
      wholeBytes = JSON.stringify(info.snapshot).length;
      assert.deepEqual(ids(info.snapshot["workspaces"]), full);
    } finally {
      await whole.close();
    }
    const cap = Math.floor(wholeBytes * 0.6);

    const client = new PagingClient({ socketPath: daemon.socketPath, maxFrameBytes: cap });
    try {
      const info = await client.subscribe();
      assert.deepEqual(ids(info.snapshot["workspaces"]), full);
      assert.equal(client.pages.length, 2, "the snapshot's 500, then pages of 500 and 203");
      assert.equal(info.reason, "initial");
    } finally {
      await client.close();
    }

    const capped = new XumClient({ socketPath: daemon.socketPath, maxFrameBytes: cap, reconnect: false });
    try {
      await assert.rejects(capped.subscribe({ snapshotPage: 0 }), ConnectionLost);
    } finally {
      await capped.close();
    }
  });
});

test("events between the snapshot's pages: a workspace created and one removed meanwhile end right", async () => {
  await withDaemon(async (daemon, tmp) => {
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    const client = new PagingClient({ socketPath: daemon.socketPath });
    try {
      const project = (await other.call("project.add", { path: makeRepo(join(tmp, "p")) })).project.id;
      const made: string[] = [];
      for (let i = 0; i < 5; i++) {
        made.push((await other.call("workspace.create", { project_id: project, name: `w${i}`, runtime: "directory" })).workspace.id);
      }
      let created = "";
      client.beforePage = async (n) => {
        if (n !== 1) return;
        // After the snapshot's first page (w0, w1), before the rest is read: one that a later
        // page would have shown goes, and a new one comes.
        await other.call("workspace.remove", { workspace_id: made[3] as string, force: true });
        created = (await other.call("workspace.create", { project_id: project, name: "late", runtime: "directory" })).workspace.id;
      };
      const state = new Map<string, WorkspaceInfo>();
      const events: RawEvent[] = [];
      client.on("snapshot", (info) => {
        state.clear();
        for (const w of info.snapshot["workspaces"] as WorkspaceInfo[]) state.set(w.id, w);
      });
      client.on("event", (event) => {
        events.push(event);
        const data = event.data as { workspace?: WorkspaceInfo; workspace_id?: string };
        if (event.type === "workspace.removed" && data.workspace_id) state.delete(data.workspace_id);
        else if (event.type.startsWith("workspace.") && data.workspace) state.set(data.workspace.id, data.workspace);
      });
      const info = await client.subscribe({ types: ["workspace."], snapshotPage: 2 });
      assert.ok(client.pages.length >= 2, `pages: ${client.pages.length}`);
      assert.ok(events.length > 0, "the events published between pages were delivered after the snapshot");
      assert.ok(events.every((e) => e.seq > info.seq), "no event at or before the snapshot's seq");
      const now = (await other.call("workspace.list", {})).workspaces;
      const expected = new Map(now.map((w) => [w.id, w]));
      await until(() => state.size === expected.size && [...expected.keys()].every((id) => state.has(id)), "the state to match the listing");
      assert.ok(!state.has(made[3] as string), "the removed workspace is gone");
      assert.ok(state.has(created), "the late workspace is there");
      for (const [id, w] of expected) assert.equal(state.get(id)?.state, w.state, id);
    } finally {
      await client.close();
      await other.close();
    }
  });
});

test("a connection lost between the snapshot's pages: no half snapshot is emitted, the next connection takes it whole", async () => {
  await withDaemon(async (daemon, tmp) => {
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    const client = new PagingClient({ socketPath: daemon.socketPath, reconnect: { initialDelayMs: 20, maxDelayMs: 200 } });
    try {
      const project = (await other.call("project.add", { path: makeRepo(join(tmp, "p")) })).project.id;
      for (let i = 0; i < 5; i++) {
        await other.call("workspace.create", { project_id: project, name: `w${i}`, runtime: "directory" });
      }
      await other.close();
      const snapshots: { reason: string; count: number }[] = [];
      client.on("snapshot", (info) => snapshots.push({ reason: info.reason, count: (info.snapshot["workspaces"] as unknown[]).length }));
      await client.subscribe({ snapshotPage: 2 });
      const firstEpoch = client.position?.epoch;
      let dropped = 0;
      client.beforePage = async () => {
        if (dropped > 0) return;
        dropped++;
        await client.disconnect(); // the page then goes nowhere: the attempt fails
      };
      const lost = once(client, "connect_failed");
      await daemon.kill();
      await daemon.start();
      await lost;
      await until(() => snapshots.length === 2 && client.connected, "the snapshot of the new daemon run");
      assert.equal(dropped, 1, "one attempt was cut between two pages");
      assert.deepEqual(snapshots, [
        { reason: "initial", count: 5 },
        { reason: "epoch_changed", count: 5 },
      ]);
      assert.notEqual(client.position?.epoch, firstEpoch);
    } finally {
      await client.close();
    }
  });
});

test("a bad snapshotPage is refused before anything is sent", async () => {
  const client = new XumClient({ socketPath: "/nonexistent/xumd.sock", reconnect: false });
  try {
    for (const bad of [-1, 1.5, 10_001]) {
      await assert.rejects(client.subscribe({ snapshotPage: bad }), /snapshotPage/);
    }
  } finally {
    await client.close();
  }
});
