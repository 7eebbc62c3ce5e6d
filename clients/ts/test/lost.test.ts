// A daemon killed mid-request (SIGKILL, a real daemon): the call's ConnectionLost says whether
// its request went out (no answer came: the outcome is unknown) or never did (the daemon never
// saw it), as `sent` and in its message, naming the call.

import assert from "node:assert/strict";
import { test } from "node:test";

import { ConnectionLost, XumClient } from "../src/index.js";
import { withDaemon } from "./support/daemon.js";

async function failure(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => assert.fail("the call succeeded"),
    (e: unknown) => e,
  );
}

test("killed while a call runs: sent, and no answer came", async () => {
  await withDaemon(async (daemon) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath, reconnect: false });
    try {
      const sleeping = failure(client.callRaw("test.sleep", { seconds: 60 }));
      // Answers come in order of reading: once this one is answered, the sleep was read.
      await client.call("daemon.status");
      await daemon.kill();
      const err = await sleeping;
      assert.ok(err instanceof ConnectionLost, String(err));
      assert.equal(err.method, "test.sleep");
      assert.equal(err.sent, true);
      assert.match(err.message, /^test\.sleep was sent and the connection was lost before its answer \(the daemon closed the connection\): the daemon may or may not have done it/);
    } finally {
      await client.close();
    }
  });
});

test("killed while it was not reading: the calls queued behind were never sent", async () => {
  await withDaemon(async (daemon) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath, reconnect: false });
    let stopped = false;
    try {
      process.kill(daemon.pid, "SIGSTOP");
      stopped = true;
      // 8 MiB cannot pass the socket's buffers to a daemon that does not read: the rest of it,
      // and all of the call behind it, stay in this process.
      const big = failure(client.callRaw("daemon.status", { pad: "x".repeat(8 * 1024 * 1024) }));
      const behind = failure(client.call("project.list"));
      await daemon.kill(); // SIGKILL ends a stopped process too
      stopped = false;
      for (const [err, method] of [
        [await big, "daemon.status"],
        [await behind, "project.list"],
      ] as const) {
        assert.ok(err instanceof ConnectionLost, String(err));
        assert.equal(err.method, method);
        assert.equal(err.sent, false, `${method}: ${err.message}`);
        assert.match(err.message, new RegExp(`^${method.replace(".", "\\.")} was not sent: the connection was lost before the request went out \\(.+\\); the daemon never saw it$`));
      }
      // And a call after the loss (reconnecting is off): not sent either, said at once.
      const after = await failure(client.call("daemon.status"));
      assert.ok(after instanceof Error);
    } finally {
      if (stopped) process.kill(daemon.pid, "SIGCONT");
      await client.close();
    }
  });
});

test("closed by the client behind a daemon not reading: the request cut part-way is not called unsent", async () => {
  await withDaemon(async (daemon) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath, reconnect: false });
    process.kill(daemon.pid, "SIGSTOP");
    try {
      const big = failure(client.callRaw("daemon.status", { pad: "x".repeat(8 * 1024 * 1024) }));
      const behind = failure(client.call("project.list"));
      await client.close();
      const cut = await big;
      assert.ok(cut instanceof ConnectionLost);
      // Part of it may be in the daemon's socket: whether it runs is not this client's to say.
      assert.equal(cut.sent, true, cut.message);
      assert.match(cut.message, /this client closed the connection/);
      const queued = await behind;
      assert.ok(queued instanceof ConnectionLost);
      assert.equal(queued.sent, false, queued.message);
      assert.match(queued.message, /^project\.list was not sent: .*\(this client closed the connection\)/);
    } finally {
      process.kill(daemon.pid, "SIGCONT");
    }
  });
});
