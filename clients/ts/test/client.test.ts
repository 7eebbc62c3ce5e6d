// The client against a real xumd: calls, typed errors, timeouts, a lost connection, events.

import assert from "node:assert/strict";
import { once } from "node:events";
import { rmSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { join } from "node:path";
import { test } from "node:test";

import {
  CLIENT_VERSION,
  ClientClosed,
  ClientTimeout,
  ConnectionLost,
  DaemonNotRunning,
  XumClient,
  XumClientError,
  XumRpcError,
  isEvent,
  isRpcError,
  type RawEvent,
  type SnapshotInfo,
} from "../src/index.js";
import { makeRepo, shortTmpdir, until, withDaemon } from "./support/daemon.js";

/** What `client` emits from now on: its events and its snapshots, in order. */
function record(client: XumClient): { events: RawEvent[]; snapshots: SnapshotInfo[] } {
  const events: RawEvent[] = [];
  const snapshots: SnapshotInfo[] = [];
  client.on("event", (e) => events.push(e));
  client.on("snapshot", (s) => snapshots.push(s));
  return { events, snapshots };
}

test("calls: hello, status, a project and a workspace, typed results", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath, clientName: "ts-test" });
    try {
      assert.equal(client.server?.protocol.split(".")[0], "1");
      assert.equal(client.server?.server.name, "xumd");
      assert.ok(client.server?.capabilities.includes("workspace.create"));
      const status = await client.call("daemon.status");
      assert.equal(status.pid, daemon.pid);
      assert.equal(status.root, daemon.root);

      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await client.call("project.add", { path: repo, name: "demo" });
      assert.match(project.id, /^prj_[0-9a-f]{16}$/);
      const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "agent-a" });
      assert.equal(workspace.state, "active");
      assert.equal(workspace.name, "agent-a");
      const listed = await client.call("workspace.list", { project_id: project.id });
      assert.deepEqual(
        listed.workspaces.map((w) => w.id),
        [workspace.id],
      );
      // Concurrent calls on one connection are matched by id, whatever order the answers come in.
      const [a, b, c] = await Promise.all([
        client.call("workspace.get", { workspace_id: workspace.id }),
        client.call("project.get", { project_id: project.id }),
        client.call("daemon.status"),
      ]);
      assert.equal(a.workspace.id, workspace.id);
      assert.equal(b.project.id, project.id);
      assert.equal(c.pid, daemon.pid);
    } finally {
      await client.close();
    }
  });
});

test("errors carry code, kind, message and data (not_found, invalid_name, busy with holders)", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const missing = "ws_0123456789abcdef";
      const err = await client.call("workspace.get", { workspace_id: missing }).then(
        () => assert.fail("workspace.get of an unknown id succeeded"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof XumRpcError);
      assert.equal(err.kind, "not_found");
      assert.equal(err.code, -32001);
      assert.equal(err.data["id"], missing);
      assert.match(err.message, /not found/);
      assert.ok(isRpcError(err, "not_found"));
      assert.ok(!isRpcError(err, "busy"));

      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await client.call("project.add", { path: repo });
      await assert.rejects(client.call("workspace.create", { project_id: project.id, name: "../escape" }), (e: unknown) => {
        assert.ok(isRpcError(e, "invalid_name"));
        assert.equal(e.code, -32004);
        assert.equal(e.data["name"], "../escape");
        return true;
      });

      // busy: a lease held by this (live) process; archive names it as a holder.
      const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "held" });
      await client.call("lease.acquire", { workspace_id: workspace.id, kind: "editor", pid: process.pid, label: "vscode" });
      await assert.rejects(client.call("workspace.archive", { workspace_id: workspace.id }), (e: unknown) => {
        assert.ok(isRpcError(e, "busy"));
        assert.equal(e.code, -32002);
        const holders = e.holders;
        assert.ok(
          holders.some((h) => h.pid === process.pid && h.kind === "editor"),
          `holders name this process: ${JSON.stringify(holders)}`,
        );
        return true;
      });
      // Nothing was changed by the refusal.
      const after = await client.call("workspace.get", { workspace_id: workspace.id });
      assert.equal(after.workspace.state, "active");
    } finally {
      await client.close();
    }
  });
});

test("a call's own timeout: ClientTimeout, the late answer is dropped, the connection lives on", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await client.call("project.add", { path: repo });
      const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "slow" });
      const { process: proc } = await client.call("process.spawn", {
        workspace_id: workspace.id,
        kind: "exec",
        argv: ["sleep", "60"],
      });
      // process.wait answers after 2 s at the earliest; this call gives up after 100 ms.
      await assert.rejects(
        client.call("process.wait", { process_id: proc.id, timeout_s: 2 }, { timeoutMs: 100 }),
        (e: unknown) => e instanceof ClientTimeout && e.method === "process.wait",
      );
      const status = await client.call("daemon.status");
      assert.equal(status.pid, daemon.pid);
      // The late answer to the timed-out id arrives (the daemon's own `timeout` error) and is
      // ignored: the next call still gets its own answer, not that one.
      await assert.rejects(client.call("process.wait", { process_id: proc.id, timeout_s: 2.5 }), (e: unknown) => {
        assert.ok(isRpcError(e, "timeout"));
        assert.match(e.message, /2\.5/);
        return true;
      });
      await client.call("process.stop", { process_id: proc.id, grace_s: 1 });
    } finally {
      await client.close();
    }
  });
});

test("a connection lost mid-call fails that call (never re-sent); the client reconnects", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({
      socketPath: daemon.socketPath,
      reconnect: { initialDelayMs: 20, maxDelayMs: 200 },
    });
    try {
      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await client.call("project.add", { path: repo });
      const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "w" });
      const { process: proc } = await client.call("process.spawn", {
        workspace_id: workspace.id,
        kind: "exec",
        argv: ["sleep", "60"],
      });
      const disconnected = once(client, "disconnect");
      const waiting = client.call("process.wait", { process_id: proc.id, timeout_s: 30 }).then(
        () => null,
        (e: unknown) => e,
      );
      await daemon.kill();
      assert.ok((await waiting) instanceof ConnectionLost);
      await disconnected;
      assert.equal(client.connected, false);
      const reconnected = once(client, "connect");
      await daemon.start();
      await reconnected;
      const status = await client.call("daemon.status");
      assert.equal(status.pid, daemon.pid);
    } finally {
      await client.close();
    }
  });
});

test("a call made while the daemon is down waits for the reconnection within its timeout", async () => {
  await withDaemon(async (daemon) => {
    const client = await XumClient.connect({
      socketPath: daemon.socketPath,
      reconnect: { initialDelayMs: 20, maxDelayMs: 100 },
    });
    try {
      await daemon.stop();
      await until(() => !client.connected, "the client to see the daemon gone");
      // Down: a call with a short timeout fails saying why (no daemon), not hangs.
      await assert.rejects(client.call("daemon.status", {}, { timeoutMs: 150 }), (e: unknown) => e instanceof DaemonNotRunning);
      const pending = client.call("daemon.status", {}, { timeoutMs: 20_000 });
      await daemon.start();
      const status = await pending;
      assert.equal(status.pid, daemon.pid);
    } finally {
      await client.close();
    }
  });
});

test("no daemon: DaemonNotRunning for a missing socket and for a stale one", async () => {
  await withDaemon(async (daemon, tmp) => {
    await assert.rejects(XumClient.connect({ socketPath: join(tmp, "nothing.sock"), reconnect: false }), (e: unknown) => {
      assert.ok(e instanceof DaemonNotRunning);
      assert.match(e.reason, /no socket at/);
      return true;
    });
    await daemon.kill(); // SIGKILL leaves the socket file: nobody listens on it
    await assert.rejects(XumClient.connect({ socketPath: daemon.socketPath, reconnect: false }), (e: unknown) => {
      assert.ok(e instanceof DaemonNotRunning);
      assert.equal(e.reason, "stale socket");
      return true;
    });
  });
});

test("waitConnected with nothing to wait for rejects at once, not at its timeout", async () => {
  await withDaemon(async (daemon, tmp) => {
    // Reconnecting off, never started: no attempt is coming.
    const idle = new XumClient({ socketPath: join(tmp, "nothing.sock"), reconnect: false });
    let started = Date.now();
    await assert.rejects(idle.waitConnected(30_000), (e: unknown) => e instanceof DaemonNotRunning);
    assert.ok(Date.now() - started < 5_000, "rejected at once");
    // Closed: nothing will ever connect.
    const closed = await XumClient.connect({ socketPath: daemon.socketPath });
    await closed.close();
    started = Date.now();
    await assert.rejects(closed.waitConnected(30_000), (e: unknown) => e instanceof ClientClosed);
    assert.ok(Date.now() - started < 5_000, "rejected at once");
  });
});

test("another major protocol version: protocol_mismatch naming both sides, no reconnect loop", async () => {
  await withDaemon(async (daemon) => {
    const client = new XumClient({ socketPath: daemon.socketPath, protocol: "99.0" });
    const failures: [Error, number | null][] = [];
    client.on("connect_failed", (e, retry) => failures.push([e, retry]));
    try {
      await assert.rejects(client.open(), (e: unknown) => {
        assert.ok(isRpcError(e, "protocol_mismatch"));
        assert.equal(e.data["client_protocol"], "99.0");
        assert.ok(Array.isArray(e.data["server_protocols"]));
        return true;
      });
      assert.equal(failures.length, 1);
      assert.equal(failures[0]?.[1], null, "no retry is scheduled");
      assert.equal(client.connected, false);
    } finally {
      await client.close();
    }
  });
});

test("a frame longer than the client's cap ends the connection; the subscription resyncs past it", async () => {
  await withDaemon(async (daemon) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath, maxFrameBytes: 4096, reconnect: false });
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const { events, snapshots } = record(client);
      await client.subscribe({ types: ["test."] });
      const dropped = once(client, "disconnect");
      // A small event passes; one with a 10 kB field is a frame over the cap.
      await other.callRaw("test.publish", { type: "test.small", data: { blob: "x" } });
      await other.callRaw("test.publish", { type: "test.big", data: { blob: "x".repeat(10_000) } });
      const [reason] = (await dropped) as [Error];
      assert.ok(reason instanceof ConnectionLost);
      assert.match(reason.message, /frame too long/);
      assert.equal(client.connected, false);
      // Reconnecting is off (no background retries), but a later call makes one new attempt. It
      // does not resume from the last seq (that would replay the same big event and drop the
      // connection again, forever): it takes a fresh snapshot.
      const status = await client.call("daemon.status");
      assert.equal(status.pid, daemon.pid);
      await until(() => snapshots.length === 2, "a resync snapshot");
      assert.equal(snapshots[1]?.reason, "resync");
      await other.callRaw("test.publish", { type: "test.after" });
      await until(() => events.some((e) => e.type === "test.after"), "a live event after the resync");
      assert.deepEqual(
        events.map((e) => e.type),
        ["test.small", "test.after"],
      );
    } finally {
      await client.close();
      await other.close();
    }
  });
});

test("events: a snapshot, then each event once and in order", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath });
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const { events, snapshots } = record(client);
      const first = await client.subscribe({ types: ["project.", "workspace."] });
      assert.equal(first.reason, "initial");
      assert.deepEqual(first.snapshot["projects"], []);
      assert.equal(snapshots.length, 1);

      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await other.call("project.add", { path: repo, name: "evt" });
      await other.call("workspace.create", { project_id: project.id, name: "one" });
      const added = await until(() => events.find((e) => e.type === "project.added"), "project.added");
      assert.ok(isEvent(added, "project.added"));
      if (isEvent(added, "project.added")) {
        // Typed data: the generated EventDataMap narrows on `type` (data.project is a ProjectInfo).
        assert.equal(added.data.project.id, project.id);
        assert.equal(added.data.project.name, "evt");
      }
      await until(
        () => events.some((e) => e.type === "workspace.state_changed"),
        "workspace.state_changed",
      );
      const seqs = events.map((e) => e.seq);
      assert.deepEqual(seqs, [...seqs].sort((x, y) => x - y));
      assert.equal(new Set(seqs).size, seqs.length);
      assert.ok(events.every((e) => e.epoch === first.epoch));
      assert.ok(events.every((e) => e.seq > first.seq));
      assert.ok(events.every((e) => e.type.startsWith("project.") || e.type.startsWith("workspace.")));
      assert.deepEqual(client.position, { epoch: first.epoch, seq: seqs[seqs.length - 1] });
    } finally {
      await client.close();
      await other.close();
    }
  });
});

test("after a daemon restart the subscription resumes: a snapshot of the new run, then its events", async () => {
  await withDaemon(async (daemon) => {
    const client = await XumClient.connect({
      socketPath: daemon.socketPath,
      reconnect: { initialDelayMs: 20, maxDelayMs: 200 },
    });
    try {
      const { events, snapshots } = record(client);
      const first = await client.subscribe({ types: ["test."] });
      await client.callRaw("test.publish", { type: "test.before", count: 3 });
      await until(() => events.length === 3, "three events before the restart");

      await daemon.stop();
      await daemon.start();
      await until(() => snapshots.length === 2, "the new run's snapshot");
      const second = snapshots[1]!;
      assert.equal(second.reason, "epoch_changed");
      assert.notEqual(second.epoch, first.epoch);

      await client.callRaw("test.publish", { type: "test.after", count: 2 });
      await until(() => events.length === 5, "two events after the restart");
      assert.deepEqual(
        events.map((e) => [e.type, e.epoch]),
        [
          ["test.before", first.epoch],
          ["test.before", first.epoch],
          ["test.before", first.epoch],
          ["test.after", second.epoch],
          ["test.after", second.epoch],
        ],
      );
    } finally {
      await client.close();
    }
  });
});

test("a dropped connection resumes where it left off: the missed events replayed, no snapshot", async () => {
  await withDaemon(async (daemon) => {
    // Reconnecting by hand (reconnect off): the gap is a step of the test, not a race with a timer.
    const client = await XumClient.connect({ socketPath: daemon.socketPath, reconnect: false });
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const { events, snapshots } = record(client);
      const first = await client.subscribe({ types: ["test.kept"] });
      await other.callRaw("test.publish", { type: "test.kept", count: 2 });
      await until(() => events.length === 2, "two live events");

      await client.disconnect();
      // Missed while away: three of the subscribed type, and others the filter leaves out.
      await other.callRaw("test.publish", { type: "test.kept", data: { n: 1 }, count: 3 });
      await other.callRaw("test.publish", { type: "test.other", count: 2 });
      await client.open();
      await until(() => events.length === 5, "the three missed events, replayed");
      await other.callRaw("test.publish", { type: "test.kept", data: { n: 2 } });
      await until(() => events.length === 6, "a live event after the resume");

      assert.equal(snapshots.length, 1, "a resume delivers no snapshot");
      const seqs = events.map((e) => e.seq);
      assert.deepEqual(seqs, [...seqs].sort((x, y) => x - y));
      assert.equal(new Set(seqs).size, 6);
      assert.ok(events.every((e) => e.type === "test.kept" && e.epoch === first.epoch));
      assert.deepEqual(
        events.map((e) => (e.data as { n?: number }).n),
        [undefined, undefined, 1, 1, 1, 2],
      );
    } finally {
      await client.close();
      await other.close();
    }
  });
});

test("a gap the daemon's ring no longer holds: resync_required, a new snapshot, then live events", async () => {
  await withDaemon(
    async (daemon) => {
      const client = await XumClient.connect({ socketPath: daemon.socketPath, reconnect: false });
      const other = await XumClient.connect({ socketPath: daemon.socketPath });
      try {
        const { events, snapshots } = record(client);
        const first = await client.subscribe({ types: ["test."] });
        await client.disconnect();
        // Ten events into a ring of four: the one right after the client's seq is gone.
        const { seq: lastMissed } = (await other.callRaw("test.publish", { type: "test.missed", count: 10 })) as {
          seq: number;
        };
        await client.open();
        await until(() => snapshots.length === 2, "the resync snapshot");
        const resync = snapshots[1]!;
        assert.equal(resync.reason, "resync");
        assert.equal(resync.epoch, first.epoch);
        assert.equal(resync.seq, lastMissed);
        assert.equal(events.length, 0, "nothing replayed: the snapshot stands for what was missed");
        await other.callRaw("test.publish", { type: "test.live" });
        await until(() => events.length === 1, "a live event after the resync");
        assert.equal(events[0]?.type, "test.live");
        assert.equal(events[0]?.seq, lastMissed + 1);
      } finally {
        await client.close();
        await other.close();
      }
    },
    { config: "event_ring_size = 4\n" },
  );
});

test("reconnecting off: a failed attempt is not final, the next call tries again", async () => {
  await withDaemon(async (daemon) => {
    const client = new XumClient({ socketPath: daemon.socketPath, reconnect: false, timeoutMs: 5000 });
    try {
      await daemon.stop();
      await assert.rejects(client.call("daemon.status"), (e: unknown) => e instanceof DaemonNotRunning);
      await assert.rejects(client.call("daemon.status"), (e: unknown) => e instanceof DaemonNotRunning);
      await daemon.start();
      const status = await client.call("daemon.status");
      assert.equal(status.pid, daemon.pid);
    } finally {
      await client.close();
    }
  });
});

test("subscribe before connecting; unsubscribe stops the events; close mid-connect leaves nothing open", async () => {
  await withDaemon(async (daemon) => {
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    // Not connected yet: subscribe starts the connection and subscribes as it comes up.
    const client = new XumClient({ socketPath: daemon.socketPath, reconnect: { initialDelayMs: 20 } });
    try {
      const events: RawEvent[] = [];
      client.on("event", (e) => events.push(e));
      const first = await client.subscribe({ types: ["test."] });
      assert.equal(first.reason, "initial");
      await assert.rejects(client.subscribe(), /already subscribed/);
      await other.callRaw("test.publish", { type: "test.one" });
      await until(() => events.length === 1, "an event");

      client.unsubscribe();
      await until(() => client.connected, "the client back without its subscription");
      await other.callRaw("test.publish", { type: "test.two" });
      // A call answered after the publish: had the event been forwarded, it would be here by now
      // (events and answers leave the daemon in order on one connection).
      await client.call("daemon.status");
      assert.deepEqual(
        events.map((e) => e.type),
        ["test.one"],
      );
      const again = await client.subscribe({ types: ["test."] });
      assert.equal(again.reason, "initial");
    } finally {
      await client.close();
    }

    // Closed while connecting: no connection is left behind on the daemon.
    for (let i = 0; i < 5; i++) {
      const quick = new XumClient({ socketPath: daemon.socketPath });
      quick.start();
      await quick.close();
      assert.equal(quick.connected, false);
    }
    await until(async () => (await other.call("daemon.status")).connections === 1, "only `other` connected");
    await other.close();
  });
});

test("a daemon that stops reading: calls beyond the queue bound fail at once with Backpressure", async () => {
  await withDaemon(
    async (daemon, tmp) => {
      const setup = await XumClient.connect({ socketPath: daemon.socketPath });
      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await setup.call("project.add", { path: repo });
      const { workspace } = await setup.call("workspace.create", { project_id: project.id, name: "w" });
      const { process: proc } = await setup.call("process.spawn", {
        workspace_id: workspace.id,
        kind: "exec",
        argv: ["sleep", "60"],
      });
      const client = await XumClient.connect({ socketPath: daemon.socketPath, maxQueuedBytes: 64 * 1024 });
      try {
        // One request in flight is this connection's limit (config below): while it waits, the
        // daemon admits no other request that needs a task (it answers only what it can at once:
        // hello, daemon.status), and the requests pile up in the kernel, then here.
        const holding = client.call("process.wait", { process_id: proc.id, timeout_s: 30 }).catch((e: unknown) => e);
        // 5 MB of requests (10 kB each): more than the kernel's socket buffers and the bound.
        const pad = "x".repeat(10_000);
        const outcomes = await Promise.all(
          Array.from({ length: 500 }, () =>
            client.callRaw("workspace.list", { pad }, { timeoutMs: 3000 }).then(
              () => "answered",
              (e: unknown) => (e instanceof Error ? e.name : String(e)),
            ),
          ),
        );
        assert.ok(outcomes.includes("Backpressure"), JSON.stringify(outcomes.slice(-5)));
        // The rest were sent and then timed out (the daemon reads them only after process.wait).
        assert.ok(outcomes.every((o) => o === "Backpressure" || o === "ClientTimeout"), JSON.stringify([...new Set(outcomes)]));
        await setup.call("process.stop", { process_id: proc.id, grace_s: 1 });
        await holding;
      } finally {
        await client.close();
        await setup.close();
      }
    },
    { config: "max_inflight_per_connection = 1\n" },
  );
});

test("a resume answered by another run (epoch) without resync_required is still a new snapshot", async () => {
  // A peer of our own: the first connection starts run e1; the second answers the resume with
  // run e2 and does not say resync_required (xumd does; the client must not rely on it).
  const dir = shortTmpdir();
  const socketPath = join(dir, "fake.sock");
  let connections = 0;
  const asked: Record<string, unknown>[] = [];
  const sockets: Socket[] = [];
  const server = createServer((sock) => {
    sockets.push(sock);
    const run = ++connections === 1 ? "e1" : "e2";
    let buffered = "";
    sock.on("data", (chunk) => {
      buffered += chunk.toString();
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const request = JSON.parse(buffered.slice(0, nl)) as { id: number; method: string; params: Record<string, unknown> };
        buffered = buffered.slice(nl + 1);
        const result =
          request.method === "hello"
            ? { protocol: "1.1", server: { name: "fake", version: CLIENT_VERSION }, root: null, capabilities: [] }
            : request.method === "events.subscribe"
              ? (asked.push(request.params), { epoch: run, seq: 5, snapshot: { projects: [], workspaces: [] } })
              : {};
        sock.write(JSON.stringify({ jsonrpc: "2.0", id: request.id, result }) + "\n");
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  const client = await XumClient.connect({ socketPath, reconnect: { initialDelayMs: 20, maxDelayMs: 100 } });
  try {
    const { snapshots } = record(client);
    const first = await client.subscribe();
    assert.equal(first.epoch, "e1");
    for (const sock of sockets) sock.destroy();
    await until(() => snapshots.length === 2, "the second run's snapshot");
    assert.equal(asked[1]?.["epoch"], "e1", "it asked to resume the first run");
    assert.equal(snapshots[1]?.reason, "epoch_changed");
    assert.equal(snapshots[1]?.epoch, "e2");
    assert.deepEqual(client.position, { epoch: "e2", seq: 5 });
  } finally {
    await client.close();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a saved position the daemon cannot resume from gives a snapshot: another run's, or a gap its ring lost", async () => {
  await withDaemon(
    async (daemon) => {
      const other = await XumClient.connect({ socketPath: daemon.socketPath });
      try {
        const { seq: now } = (await other.callRaw("test.publish", { type: "test.x", count: 10 })) as { seq: number };
        const epoch = other.server?.epoch;
        assert.ok(typeof epoch === "string");

        const elsewhere = await XumClient.connect({ socketPath: daemon.socketPath });
        try {
          const { snapshots } = record(elsewhere);
          const answer = await elsewhere.subscribe({ types: ["test."], resumeFrom: { epoch: "0000000000000000", seq: 3 } });
          assert.equal(answer.reason, "epoch_changed");
          assert.equal(answer.epoch, epoch);
          assert.equal(answer.seq, now);
          assert.deepEqual(snapshots.map((s) => s.reason), ["epoch_changed"]);
        } finally {
          await elsewhere.close();
        }

        // Ten events into a ring of four: the one right after seq 1 is gone.
        const lost = await XumClient.connect({ socketPath: daemon.socketPath });
        try {
          const { events } = record(lost);
          const answer = await lost.subscribe({ types: ["test."], resumeFrom: { epoch, seq: now - 9 } });
          assert.equal(answer.reason, "resync");
          assert.equal(answer.seq, now);
          assert.equal(events.length, 0, "the snapshot stands for what was missed");
          assert.deepEqual(lost.position, { epoch, seq: now });
        } finally {
          await lost.close();
        }
      } finally {
        await other.close();
      }
    },
    { config: "event_ring_size = 4\n" },
  );
});

test("resumeFrom that is not a saved position is refused before anything is sent", async () => {
  const tmp = shortTmpdir();
  const client = new XumClient({ root: join(tmp, "none"), reconnect: false });
  try {
    for (const bad of [{ epoch: "", seq: 1 }, { epoch: "e", seq: -1 }, { epoch: "e", seq: 1.5 }, { epoch: null, seq: 2 }]) {
      await assert.rejects(
        client.subscribe({ resumeFrom: bad as unknown as { epoch: string; seq: number } }),
        (err: unknown) => err instanceof XumClientError && /resumeFrom must be/.test(err.message),
      );
      assert.equal(client.position, null, "not left subscribed");
    }
    // None saved (a position read before any subscription): a plain subscription, typed as one.
    const plain: Promise<SnapshotInfo> = client.subscribe({ resumeFrom: null });
    await assert.rejects(plain, DaemonNotRunning);
  } finally {
    await client.close();
    rmSync(tmp, { recursive: true, force: true });
  }
});
