// The client as a user's script uses it: its own node process, left to end by itself.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { test } from "node:test";

import { shortTmpdir } from "./support/daemon.js";
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
