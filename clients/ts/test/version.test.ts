// The release check after `hello` (docs/PROTOCOL.md, "Releases"): the same rule, kind and message
// as the Python client's (tests/protocol/test_version_check.py), against a real xumd and a peer of our own.

import assert from "node:assert/strict";
import { readFileSync, rmSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { join } from "node:path";
import { test } from "node:test";

import { CLIENT_VERSION, VersionMismatch, XumClient, releaseLine } from "../src/index.js";
import { repoRoot, shortTmpdir, until, withDaemon } from "./support/daemon.js";

test("this client's release is the Python distribution's", () => {
  const pyproject = readFileSync(join(repoRoot(), "pyproject.toml"), "utf8");
  const version = /^version = "([^"]+)"$/m.exec(pyproject)?.[1];
  assert.equal(CLIENT_VERSION, version);
});

test("releaseLine reads major.minor as the Python client does", () => {
  const table: [string, [number, number] | null][] = [
    ["0.1.0", [0, 1]],
    ["1.2.3rc1", [1, 2]],
    ["0.1.0+local", [0, 1]],
    ["2.10", [2, 10]],
    ["dev", null],
    ["1", null],
    ["", null],
    ["1.x", null],
  ];
  for (const [text, line] of table) assert.deepEqual(releaseLine(text), line, text);
});

test("a client of another minor is refused naming both; a patch release is accepted", async () => {
  await withDaemon(async (daemon) => {
    const failures: (number | null)[] = [];
    const refused = new XumClient({ socketPath: daemon.socketPath, clientVersion: "0.99.0" });
    refused.on("connect_failed", (_err, retryInMs) => failures.push(retryInMs));
    let theirs = "";
    try {
      await assert.rejects(refused.open(), (err: unknown) => {
        assert.ok(err instanceof VersionMismatch, String(err));
        assert.equal(err.kind, "version_mismatch");
        theirs = err.serverVersion;
        assert.deepEqual(err.data, { client_version: "0.99.0", server_version: theirs, where: `on ${daemon.root}` });
        assert.match(err.message, /^this client is xum 0\.99\.0 but the daemon on .* is xumd \S+: their versions differ \(major\.minor\); restart the daemon/);
        return true;
      });
      // Retrying cannot help until someone restarts the daemon: no retry is scheduled.
      assert.deepEqual(failures, [null]);
    } finally {
      await refused.close();
    }
    const [major, minor] = releaseLine(theirs) ?? [0, 0];
    const patch = await XumClient.connect({ socketPath: daemon.socketPath, clientVersion: `${major}.${minor}.97` });
    try {
      assert.equal(patch.server?.server.version, theirs);
      // The refused connection was closed, not leaked: the daemon counts only this one.
      await until(async () => (await patch.call("daemon.status")).connections === 1, "one connection");
    } finally {
      await patch.close();
    }
    const unchecked = await XumClient.connect({ socketPath: daemon.socketPath, clientVersion: "7.0.0", checkVersion: false });
    await unchecked.close();
  });
});

test("a daemon whose version cannot be read is refused too", async () => {
  const dir = shortTmpdir();
  const socketPath = join(dir, "fake.sock");
  const sockets: Socket[] = [];
  const server = createServer((sock) => {
    sockets.push(sock);
    sock.on("data", (chunk) => {
      for (const line of chunk.toString().split("\n").filter(Boolean)) {
        const request = JSON.parse(line) as { id: number };
        const result = { protocol: "1.1", server: { name: "fake", version: "dev" }, root: "/r", capabilities: [] };
        sock.write(JSON.stringify({ jsonrpc: "2.0", id: request.id, result }) + "\n");
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  try {
    await assert.rejects(XumClient.connect({ socketPath, reconnect: false }), (err: unknown) => {
      assert.ok(err instanceof VersionMismatch, String(err));
      assert.equal(err.serverVersion, "dev");
      assert.equal(err.data.where, "on /r");
      return true;
    });
  } finally {
    for (const sock of sockets) sock.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  }
});
