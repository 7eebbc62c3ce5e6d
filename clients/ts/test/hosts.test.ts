// The client through a host (docs/HOSTS.md): a real OpenSSH server on loopback (the Python
// suite's tests/support/sshd.py), `ssh ... xum bridge` to a real xumd on a temp root.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { once } from "node:events";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import {
  ConnectionLost,
  HostConfigError,
  HostConnectionLost,
  HostKeyRefused,
  HostUnreachable,
  VersionMismatch,
  XumClient,
  classifyFailure,
  loadHosts,
  sshCommand,
  sshProgram,
  type HostEntry,
} from "../src/index.js";
import { repoRoot, shortTmpdir, until, withDaemon } from "./support/daemon.js";
import { pythonCommand, startSshd, type Sshd } from "./support/sshd.js";

function python(code: string, env: Record<string, string> = {}, args: string[] = []): string {
  return execFileSync(pythonCommand(), ["-c", code, ...args], {
    cwd: repoRoot(),
    env: { ...process.env, ...env },
    encoding: "utf8",
  });
}

test("the ssh command is the Python client's, word for word", () => {
  const entry: HostEntry = {
    name: "dev-1",
    dest: "me@dev.example",
    remoteRoot: "/srv/a b'c$(x)",
    sshOptions: { ConnectTimeout: "5", ProxyJump: "jump host" },
  };
  const env = { XUM_SSH: "ssh -F '/tmp/my config'" };
  const theirs = JSON.parse(
    python(
      "import json; from xum_client.hosts import HostEntry, ssh_command; " +
        "print(json.dumps(ssh_command(HostEntry('dev-1', 'me@dev.example', \"/srv/a b'c$(x)\", " +
        "{'ConnectTimeout': '5', 'ProxyJump': 'jump host'}))))",
      env,
    ),
  ) as string[];
  assert.deepEqual(sshCommand(entry, env), theirs);
});

test("$XUM_SSH is split as the Python client and the Neovim plugin split it", () => {
  // The one table all three clients' tests read (tests/support/xum_ssh_cases.json).
  const table = JSON.parse(readFileSync(join(repoRoot(), "tests", "support", "xum_ssh_cases.json"), "utf8")) as {
    cases: { text: string; words?: string[]; error?: string }[];
  };
  assert.ok(table.cases.length > 0);
  for (const { text, words, error } of table.cases) {
    const env = { XUM_SSH: text };
    if (error !== undefined) {
      assert.throws(() => sshProgram(env), (err: unknown) => err instanceof HostConfigError && err.message.includes(error), text);
    } else {
      assert.deepEqual(sshProgram(env), words, text);
    }
  }
});

test("an ssh failure is classified as the Python client and the Neovim plugin classify it", () => {
  // The one table all three clients' tests read (tests/support/ssh_failures.json).
  const table = JSON.parse(readFileSync(join(repoRoot(), "tests", "support", "ssh_failures.json"), "utf8")) as {
    entry: HostEntry;
    cases: { status: number; stderr: string; kind: string; message: string }[];
  };
  assert.ok(table.cases.length > 0);
  for (const { status, stderr, kind, message } of table.cases) {
    const error = classifyFailure(table.entry, status, stderr);
    assert.deepEqual([error.kind, error.message], [kind, message]);
  }
});

test("the hosts file `xum host add` writes is read the same", () => {
  const tmp = shortTmpdir();
  try {
    const file = join(tmp, "hosts.toml");
    const env = { XUM_HOSTS_FILE: file };
    python(
      "from xum_client.cli import main; import sys; " +
        "main(['host', 'add', 'box.1', 'me@box', '--remote-root', '/r \"q\" \\\\x', '--ssh-option', 'Port=2222'])",
      env,
    );
    const hosts = loadHosts(env);
    assert.deepEqual(hosts.get("box.1"), {
      name: "box.1",
      dest: "me@box",
      remoteRoot: '/r "q" \\x',
      sshOptions: { Port: "2222" },
    });
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("a hosts file reads as the Python client reads it: dotted names quoted, bare dots nest", () => {
  // The one table the Python client's tests read too (tests/support/hosts_file_cases.json).
  const table = JSON.parse(readFileSync(join(repoRoot(), "tests", "support", "hosts_file_cases.json"), "utf8")) as {
    cases: {
      name: string;
      text: string;
      error?: boolean;
      hosts?: Record<string, { dest: string; remote_root: string | null; ssh_options: Record<string, string> }>;
    }[];
  };
  assert.ok(table.cases.length >= 20);
  const tmp = shortTmpdir();
  try {
    const file = join(tmp, "hosts.toml");
    for (const c of table.cases) {
      writeFileSync(file, c.text);
      if (c.error) {
        assert.throws(() => loadHosts({}, file), (e: unknown) => e instanceof HostConfigError && e.message.includes(file), c.name);
        continue;
      }
      const got: Record<string, unknown> = {};
      for (const [name, e] of loadHosts({}, file)) {
        got[name] = { dest: e.dest, remote_root: e.remoteRoot ?? null, ssh_options: { ...e.sshOptions } };
      }
      assert.deepEqual(got, c.hosts, c.name);
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

/** An sshd, a hosts file naming `h` (the daemon's root), `down` and `badkey`. */
async function withHost(fn: (sshd: Sshd, env: Record<string, string>, daemon: { root: string; pid: number; proc: { kill: (s: NodeJS.Signals) => boolean } }) => Promise<void>, t: { skip: (r: string) => void }): Promise<void> {
  await withDaemon(async (daemon, tmp) => {
    const sshd = await startSshd(tmp);
    if (sshd.skip !== null) {
      t.skip(sshd.skip);
      return;
    }
    try {
      const file = join(tmp, "hosts.toml");
      writeFileSync(
        file,
        `[hosts.h]\ndest = "${sshd.alias}"\nremote_root = ${JSON.stringify(daemon.root)}\n\n` +
          `[hosts.down]\ndest = "${sshd.down}"\n\n[hosts.badkey]\ndest = "${sshd.badkey}"\n`,
      );
      const env = { ...(process.env as Record<string, string>), ...sshd.env, XUM_HOSTS_FILE: file };
      const proc = daemon.proc;
      assert.ok(proc !== null);
      await fn(sshd, env, { root: daemon.root, pid: daemon.pid, proc });
    } finally {
      await sshd.close();
    }
  });
}

test("through a host: the host's daemon answers, over ssh", async (t) => {
  await withHost(async (_sshd, env, daemon) => {
    const client = await XumClient.connect({ host: "h", env, reconnect: false, connectTimeoutMs: 30_000 });
    try {
      assert.equal(client.socketPath, "ssh:h");
      assert.equal(client.server?.root, daemon.root);
      const status = await client.call("daemon.status");
      assert.equal(status.pid, daemon.pid);
      assert.ok(client.transportPid !== null);
    } finally {
      await client.close();
    }
  }, t);
});

test("a host that is down, or refuses the key, is a typed one-line error", async (t) => {
  await withHost(async (_sshd, env) => {
    const down = await XumClient.connect({ host: "down", env, reconnect: false, connectTimeoutMs: 30_000 }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(down instanceof HostUnreachable, String(down));
    assert.equal(down.kind, "host_unreachable");
    assert.match(down.message, /^host 'down' \(xumtest-down\) is unreachable: .*Connection refused/);
    assert.ok(!down.message.includes("\n"));
    const refused = await XumClient.connect({ host: "badkey", env, reconnect: false, connectTimeoutMs: 30_000 }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(refused instanceof HostKeyRefused, String(refused));
    assert.equal(refused.kind, "host_key_refused");
  }, t);
});

test("ssh dying during a call: HostConnectionLost (outcome unknown), then it reconnects", async (t) => {
  await withHost(async (_sshd, env, daemon) => {
    const client = await XumClient.connect({
      host: "h",
      env,
      connectTimeoutMs: 30_000,
      reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
    });
    let second = 0;
    try {
      const ssh = client.transportPid;
      assert.ok(ssh !== null);
      // The daemon stopped: the call stays in flight until the connection goes.
      daemon.proc.kill("SIGSTOP");
      const pending = client.call("daemon.status", {}, { timeoutMs: 60_000 }).then(
        () => null,
        (e: unknown) => e,
      );
      const reconnected = once(client, "connect");
      process.kill(-ssh, "SIGKILL");
      const lost = await pending;
      daemon.proc.kill("SIGCONT");
      assert.ok(lost instanceof HostConnectionLost, String(lost));
      assert.ok(lost instanceof ConnectionLost);
      assert.equal(lost.host, "h");
      assert.equal(lost.method, "daemon.status");
      assert.equal(lost.sent, true, "handed to ssh before it died");
      assert.match(lost.message, /outcome is unknown.*xum --host h ws ls/);
      await reconnected;
      const status = await client.call("daemon.status");
      assert.equal(status.pid, daemon.pid);
      second = client.transportPid ?? 0;
      assert.ok(second !== 0 && second !== ssh);
    } finally {
      daemon.proc.kill("SIGCONT");
      await client.close();
    }
    // No ssh left behind by the client: its process group is gone.
    const group = second;
    await until(() => {
      try {
        process.kill(-group, 0);
        return false;
      } catch {
        return true;
      }
    }, "the client's ssh to be gone");
  }, t);
});

test("what a ProxyCommand left behind goes with ssh, even when ssh ended first", async (t) => {
  try {
    execFileSync("sh", ["-c", "command -v socat"], { stdio: "ignore" });
  } catch {
    t.skip("socat is not installed (apt-get install socat)");
    return;
  }
  await withHost(async (sshd, env, daemon) => {
    const marker = join(daemon.root, "..", "proxy-child.pid");
    const entry: HostEntry = {
      name: "px",
      dest: sshd.alias,
      remoteRoot: daemon.root,
      sshOptions: {
        ProxyCommand: `sh -c 'sleep 600 </dev/null >/dev/null 2>&1 & echo $! > ${marker}; exec socat - TCP:127.0.0.1:%p'`,
      },
    };
    const client = await XumClient.connect({ host: entry, env, reconnect: false, connectTimeoutMs: 30_000 });
    const child = Number(readFileSync(marker, "utf8").trim());
    const gone = (): boolean => {
      try {
        process.kill(child, 0);
        return false;
      } catch {
        return true;
      }
    };
    try {
      assert.ok(!gone(), "the proxy's child runs while connected");
      // The host's daemon stops: the bridge ends, then ssh, by itself (before any close()).
      const ended = once(client, "disconnect");
      await client.call("daemon.shutdown", {}).catch(() => undefined);
      await ended;
      await until(gone, "the proxy's child to be stopped with ssh's group");
    } finally {
      await client.close();
      if (!gone()) process.kill(child, "SIGKILL");
    }
  }, t);
});

test("a host's daemon of another release: the Python client's message, naming the host and the fix", async (t) => {
  await withHost(async (_sshd, env, daemon) => {
    const refused = await XumClient.connect({ host: "h", env, reconnect: false, connectTimeoutMs: 30_000, clientVersion: "0.99.0" }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(refused instanceof VersionMismatch, String(refused));
    const theirs = refused.serverVersion;
    const expected = python(
      "import sys; from xum_client.errors import VersionMismatch; from xum_client.sync import release_context; " +
        "print(VersionMismatch('0.99.0', sys.argv[1], *release_context(sys.argv[2], 'h')))",
      {},
      [theirs, daemon.root],
    ).trim();
    assert.equal(refused.message, expected);
  }, t);
});
