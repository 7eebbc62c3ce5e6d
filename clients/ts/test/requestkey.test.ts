// A mutating call whose answer was lost after it was sent (a real daemon, a real connection cut
// by a proxy right after it forwarded the request): the client sends it once more with its
// request key and gets the first call's outcome (docs/PROTOCOL.md, "Request keys").

import assert from "node:assert/strict";
import { createConnection, createServer } from "node:net";
import { join } from "node:path";
import { test } from "node:test";

import { ConnectionLost, XumClient, withRequestKey } from "../src/index.js";
import { makeRepo, withDaemon } from "./support/daemon.js";

interface Proxy {
  /** Whether a connection was cut. */
  cut(): boolean;
  close(): Promise<void>;
}

/** Forwards each connection to `upstream`; the first one whose client sends a line holding `cutAfter` is closed right after that line went through (its answer never comes back). */
async function cuttingProxy(listen: string, upstream: string, cutAfter: string): Promise<Proxy> {
  let cut = false;
  const server = createServer((client) => {
    const up = createConnection(upstream);
    let mine = false;
    let buffer = "";
    client.on("data", (chunk) => {
      if (mine) return;
      up.write(chunk);
      buffer += chunk.toString();
      const lines = buffer.split("\n");
      buffer = lines.pop() ?? "";
      if (!cut && lines.some((line) => line.includes(cutAfter))) {
        cut = mine = true;
        up.end();
        client.destroy();
      }
    });
    up.on("data", (chunk) => {
      if (!mine) client.write(chunk);
    });
    client.on("error", () => up.destroy());
    up.on("error", () => client.destroy());
    client.on("close", () => {
      if (!mine) up.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(listen, resolve));
  return {
    cut: () => cut,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

test("a create cut after it was sent is sent again with its key: one workspace", async () => {
  await withDaemon(async (daemon, tmp) => {
    const repo = makeRepo(join(tmp, "repo"));
    const direct = await XumClient.connect({ socketPath: daemon.socketPath });
    const proxy = await cuttingProxy(join(tmp, "p.sock"), daemon.socketPath, "workspace.create");
    const client = await XumClient.connect({ socketPath: join(tmp, "p.sock") });
    try {
      const { project } = await direct.call("project.add", { path: repo });
      const made = await client.call("workspace.create", { project_id: project.id, name: "a" });
      assert.ok(proxy.cut());
      const { workspaces } = await direct.call("workspace.list");
      assert.deepEqual(
        workspaces.filter((w) => w.name === "a").map((w) => w.id),
        [made.workspace.id],
      );
    } finally {
      await client.close();
      await direct.close();
      await proxy.close();
    }
  });
});

test("with retryLost off, the cut call is ConnectionLost, sent", async () => {
  await withDaemon(async (daemon, tmp) => {
    const repo = makeRepo(join(tmp, "repo"));
    const proxy = await cuttingProxy(join(tmp, "p.sock"), daemon.socketPath, "project.add");
    const client = await XumClient.connect({ socketPath: join(tmp, "p.sock"), retryLost: false });
    try {
      const err = await client.call("project.add", { path: repo }).then(
        () => assert.fail("the call succeeded"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof ConnectionLost, String(err));
      assert.equal(err.method, "project.add");
      assert.equal(err.sent, true);
    } finally {
      await client.close();
      await proxy.close();
    }
  });
});

test("only mutating calls carry a key, the caller's when given", () => {
  const keyed = withRequestKey("workspace.create", { name: "a" }) as Record<string, unknown>;
  assert.match(String(keyed["request_key"]), /^[0-9a-f-]{36}$/);
  assert.deepEqual(withRequestKey("workspace.create", { request_key: "mine" }), { request_key: "mine" });
  const read = { limit: 1 };
  assert.equal(withRequestKey("workspace.list", read), read);
});
