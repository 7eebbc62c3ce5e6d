// The client as a user's script uses it: its own node process, left to end by itself.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { test } from "node:test";

import { XumClient } from "../src/index.js";
import { shortTmpdir, withDaemon } from "./support/daemon.js";
import { runScript } from "./support/script.js";

/** Connects as given by argv[2] (JSON options), prints the error's name and message, and ends. */
const CONNECT_AND_FAIL = `
const { XumClient } = await import(process.env.XUM_TEST_CLIENT);
try {
  const client = await XumClient.connect(JSON.parse(process.argv[2]));
  console.log("connected", client.socketPath);
} catch (err) {
  console.log(err.name + ": " + err.message);
}
`;

test("connect() to a root with no daemon rejects, and the script then ends by itself", async () => {
  const tmp = shortTmpdir();
  try {
    const run = await runScript(CONNECT_AND_FAIL, { args: [JSON.stringify({ root: join(tmp, "none") })] });
    assert.ok(run.exited, `the script was still running at its deadline: ${run.stdout}${run.stderr}`);
    assert.equal(run.code, 0, run.stderr);
    assert.match(run.stdout, /^DaemonNotRunning: no daemon at .*\/none\/xumd\.sock/);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("connect() to a host ssh cannot reach rejects, and the script then ends by itself", async (t) => {
  try {
    execFileSync("sh", ["-c", "command -v ssh"], { stdio: "ignore" });
  } catch {
    t.skip("ssh is not installed (apt-get install openssh-client)");
    return;
  }
  // A port nothing listens on: the one a listener just gave back.
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  await new Promise<void>((resolve) => server.close(() => resolve()));
  const host = { name: "gone", dest: "127.0.0.1", sshOptions: { Port: String(address.port), ConnectTimeout: "10" } };
  const run = await runScript(CONNECT_AND_FAIL, {
    args: [JSON.stringify({ host })],
    env: { XUM_SSH: "ssh -F /dev/null" },
  });
  assert.ok(run.exited, `the script was still running at its deadline: ${run.stdout}${run.stderr}`);
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, /^HostUnreachable: host 'gone' \(127\.0\.0\.1\) is unreachable: .*Connection refused/);
});

/**
 * Subscribes to `test.resume` (resuming from argv[3] when given), publishes one event itself,
 * waits until that one arrives, and prints what it saw: the first answer, the snapshots, the
 * events, and the position to save.
 */
const SUBSCRIBER = `
const { XumClient } = await import(process.env.XUM_TEST_CLIENT);
const saved = process.argv[3] ? JSON.parse(process.argv[3]) : undefined;
const client = await XumClient.connect({ socketPath: process.argv[2] });
const events = [];
const snapshots = [];
client.on("snapshot", (s) => snapshots.push(s.reason));
const mine = new Promise((resolve) => {
  client.on("event", (e) => {
    events.push({ seq: e.seq, epoch: e.epoch, data: e.data });
    if (e.data.by === process.pid) resolve();
  });
});
const first = await client.subscribe({ types: ["test.resume"], resumeFrom: saved });
await client.callRaw("test.publish", { type: "test.resume", data: { by: process.pid } });
await mine;
console.log(JSON.stringify({ first: { reason: first.reason, epoch: first.epoch, seq: first.seq }, snapshots, events, position: client.position, pid: process.pid }));
await client.close();
`;

interface Seen {
  first: { reason: string; epoch: string; seq: number };
  snapshots: string[];
  events: { seq: number; epoch: string; data: { by?: number; n?: number } }[];
  position: { epoch: string; seq: number };
  pid: number;
}

test("a position saved by one process resumes in another: exactly the missed events, no snapshot", async () => {
  await withDaemon(async (daemon) => {
    const one = await runScript(SUBSCRIBER, { args: [daemon.socketPath] });
    assert.ok(one.exited && one.code === 0, one.stderr);
    const first = JSON.parse(one.stdout) as Seen;
    assert.equal(first.first.reason, "initial");
    assert.deepEqual(first.snapshots, ["initial"]);
    assert.deepEqual(
      first.events.map((e) => e.data.by),
      [first.pid],
    );
    assert.deepEqual(first.position, { epoch: first.first.epoch, seq: first.events[0]?.seq });

    // Missed between the two processes: three of the type, among others the filter leaves out.
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    const missed: number[] = [];
    try {
      for (const n of [1, 2, 3]) {
        await other.callRaw("test.publish", { type: "test.other" });
        const { seq } = (await other.callRaw("test.publish", { type: "test.resume", data: { n } })) as { seq: number };
        missed.push(seq);
      }
    } finally {
      await other.close();
    }

    const two = await runScript(SUBSCRIBER, { args: [daemon.socketPath, JSON.stringify(first.position)] });
    assert.ok(two.exited && two.code === 0, two.stderr);
    const second = JSON.parse(two.stdout) as Seen;
    assert.equal(second.first.reason, "resumed");
    assert.deepEqual(second.first, { reason: "resumed", epoch: first.position.epoch, seq: first.position.seq });
    assert.deepEqual(second.snapshots, [], "a resume delivers no snapshot");
    // Exactly the missed ones, in order, then its own live one.
    assert.deepEqual(
      second.events.map((e) => [e.seq, e.data.n ?? null, e.data.by ?? null]),
      [...missed.map((seq, i) => [seq, i + 1, null]), [second.events[3]?.seq, null, second.pid]],
    );
    assert.ok(second.events.every((e) => e.epoch === first.position.epoch));
    assert.ok((second.events[3]?.seq ?? 0) > (missed[2] ?? Infinity));
  });
});
