// Socket discovery: XUM_SOCKET wins, else $XUM_ROOT/xumd.sock, else the default root's socket
// ($XDG_STATE_HOME/xum, else ~/.local/state/xum). The rule, then each case against a real daemon.

import assert from "node:assert/strict";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { spawnSync } from "node:child_process";

import { DaemonNotRunning, XumClient, defaultRoot, resolveSocket, type Explicit } from "../src/index.js";
import { Daemon, repoRoot, shortTmpdir, withDaemon } from "./support/daemon.js";

test("the rule, in order; an empty variable counts as unset", () => {
  const home = "/home/me";
  assert.deepEqual(resolveSocket({ XUM_SOCKET: "/s/x.sock", XUM_ROOT: "/r", XDG_STATE_HOME: "/x" }, home), {
    path: "/s/x.sock",
    source: "XUM_SOCKET",
    root: null,
  });
  assert.deepEqual(resolveSocket({ XUM_ROOT: "/r", XDG_STATE_HOME: "/x" }, home), {
    path: "/r/xumd.sock",
    source: "XUM_ROOT",
    root: "/r",
  });
  assert.deepEqual(resolveSocket({ XDG_STATE_HOME: "/x" }, home), {
    path: "/x/xum/xumd.sock",
    source: "XDG_STATE_HOME",
    root: "/x/xum",
  });
  assert.deepEqual(resolveSocket({}, home), {
    path: "/home/me/.local/state/xum/xumd.sock",
    source: "HOME",
    root: "/home/me/.local/state/xum",
  });
  assert.equal(resolveSocket({ XUM_SOCKET: "", XUM_ROOT: "", XDG_STATE_HOME: "" }, home).source, "HOME");
  assert.equal(defaultRoot({ XUM_ROOT: "/r" }, home), "/r");
});

test("explicit socket or root first; a leading ~ is the home directory ($HOME first)", () => {
  const env = { XUM_SOCKET: "/s/x.sock", HOME: "/home/env" };
  assert.deepEqual(resolveSocket(env, undefined, { socket: "~/a.sock", root: "/r" }), {
    path: "/home/env/a.sock",
    source: "explicit",
    root: null,
  });
  assert.deepEqual(resolveSocket(env, undefined, { root: "~/r" }), {
    path: "/home/env/r/xumd.sock",
    source: "root",
    root: "/home/env/r",
  });
  assert.equal(resolveSocket({ XUM_SOCKET: "~/s.sock" }, "/h").path, "/h/s.sock");
  assert.equal(resolveSocket({ XUM_ROOT: "~" }, "/h").path, "/h/xumd.sock");
  assert.equal(resolveSocket({ XDG_STATE_HOME: "~/st" }, "/h").path, "/h/st/xum/xumd.sock");
  assert.equal(resolveSocket({ HOME: "/home/env" }).path, "/home/env/.local/state/xum/xumd.sock");
  // Only a leading ~ (and ~/...) is expanded: ~user and a ~ inside a path are left alone.
  assert.equal(resolveSocket({ XUM_SOCKET: "~other/s.sock" }, "/h").path, "~other/s.sock");
  assert.equal(resolveSocket({ XUM_SOCKET: "/a/~/s.sock" }, "/h").path, "/a/~/s.sock");
});

test("the rule matches the Python one (xum_protocol.discovery.resolve_socket), case by case", () => {
  const python = process.env["XUM_PYTHON"] ?? join(repoRoot(), ".venv", "bin", "python");
  // Every combination of the explicit choices and the environment (empty values included), as
  // the Neovim plugin's matrix (tests/clients/test_nvim_plugin.py).
  const cases: [Record<string, string>, Explicit][] = [];
  const opt = (v: string | null) => (v === null ? [] : [v]);
  for (const socket of [null, "", "/o/s.sock", "~/o.sock"])
    for (const root of [null, "", "/or", "~"])
      for (const xs of [null, "", "/s.sock", "~/s.sock", "~x/s.sock"])
        for (const xr of [null, "", "/r", "~/r"])
          for (const xdg of [null, "", "/st", "~/st"]) {
            const env: Record<string, string> = { HOME: "/h" };
            for (const [k, v] of [["XUM_SOCKET", xs], ["XUM_ROOT", xr], ["XDG_STATE_HOME", xdg]] as const)
              for (const value of opt(v)) env[k] = value;
            const ex: Explicit = {};
            for (const value of opt(socket)) ex.socket = value;
            for (const value of opt(root)) ex.root = value;
            cases.push([env, ex]);
          }
  const script = [
    "import json, sys",
    "from pathlib import Path",
    "from xum_protocol.discovery import resolve_socket",
    "out = []",
    "for env, ex in json.loads(sys.argv[1]):",
    "    c = resolve_socket(socket=ex.get('socket'), root=ex.get('root'), env=env)",
    "    out.append(str(c.path))",
    "print(json.dumps(out))",
  ].join("\n");
  const run = spawnSync(python, ["-c", script, JSON.stringify(cases)], { encoding: "utf8" });
  if (run.error !== undefined || run.status !== 0) {
    assert.fail(`python's resolve_socket could not be run: ${run.error?.message ?? run.stderr}`);
  }
  const expected = JSON.parse(run.stdout) as string[];
  assert.deepEqual(
    cases.map(([env, ex]) => resolveSocket(env, undefined, ex).path),
    expected,
  );
});

test("XUM_SOCKET wins over XUM_ROOT (a daemon whose socket is outside its root)", async () => {
  const tmp = shortTmpdir();
  const sock = join(tmp, "elsewhere.sock");
  await withDaemon(
    async (daemon) => {
      // XUM_ROOT names the root, but its socket is not there: only XUM_SOCKET reaches the daemon.
      const client = await XumClient.connect({ env: { XUM_SOCKET: sock, XUM_ROOT: daemon.root }, reconnect: false });
      try {
        assert.equal(client.socketPath, sock);
        assert.equal(client.server?.root, daemon.root);
      } finally {
        await client.close();
      }
      await assert.rejects(
        XumClient.connect({ env: { XUM_ROOT: daemon.root }, reconnect: false }),
        (e: unknown) => e instanceof DaemonNotRunning && e.socketPath === join(daemon.root, "xumd.sock"),
      );
    },
    { socketPath: sock },
  );
  rmSync(tmp, { recursive: true, force: true });
});

test("XUM_ROOT, then XDG_STATE_HOME/xum, reach a daemon on that root", async () => {
  const tmp = shortTmpdir();
  const state = join(tmp, "state");
  mkdirSync(state);
  const daemon = new Daemon(join(state, "xum"));
  try {
    await daemon.start();
    for (const env of [{ XUM_ROOT: daemon.root }, { XDG_STATE_HOME: state }]) {
      const client = await XumClient.connect({ env, reconnect: false });
      try {
        assert.equal(client.socketPath, join(daemon.root, "xumd.sock"));
        const status = await client.call("daemon.status");
        assert.equal(status.pid, daemon.pid);
      } finally {
        await client.close();
      }
    }
  } finally {
    await daemon.close();
    rmSync(tmp, { recursive: true, force: true });
  }
});
