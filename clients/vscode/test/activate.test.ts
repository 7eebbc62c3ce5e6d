// The packaged bundle (dist/extension.js, what the .vsix holds) loads and activates against a real
// daemon. VS Code itself cannot run here: `vscode` is a recording stand-in with just the API the
// extension uses. What this proves: the bundle loads, it registers exactly the commands its
// manifest declares, its tree shows the daemon's projects and workspaces live, the status bar
// tells connected from not, and a tree command reaches the daemon.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { test } from "node:test";

import { XumClient } from "../../ts/src/index.js";
import { makeRepo, repoRoot, shortTmpdir, until, withDaemon } from "../../ts/test/support/daemon.js";
import { startSshd } from "../../ts/test/support/sshd.js";

type Provider = { getChildren(node?: unknown): unknown[]; getTreeItem(node: unknown): { label?: unknown; description?: unknown } };

class FakeVscode {
  commands = new Map<string, (...args: unknown[]) => unknown>();
  providers = new Map<string, Provider>();
  status = { text: "", tooltip: "" as unknown, command: "" as unknown, show() {}, dispose() {} };
  terminals: { name?: string; cwd?: string; shellPath?: string; shellArgs?: string[] }[] = [];
  executed: { command: string; args: unknown[] }[] = [];
  errors: string[] = [];
  infos: string[] = [];

  /** `settings`: the `xum.*` settings by key (`socketPath`, `host`). */
  constructor(private readonly settings: Record<string, string> = {}) {}

  module(): Record<string, unknown> {
    const self = this;
    class EventEmitter<T> {
      listeners: ((e: T) => void)[] = [];
      event = (l: (e: T) => void) => {
        this.listeners.push(l);
        return { dispose() {} };
      };
      fire(e: T) {
        for (const l of this.listeners) l(e);
      }
    }
    class TreeItem {
      description?: string;
      tooltip?: string;
      contextValue?: string;
      iconPath?: unknown;
      id?: string;
      constructor(
        public label: string,
        public collapsibleState: number,
      ) {}
    }
    class ThemeIcon {
      constructor(public id: string) {}
    }
    return {
      EventEmitter,
      TreeItem,
      ThemeIcon,
      TreeItemCollapsibleState: { None: 0, Collapsed: 1, Expanded: 2 },
      StatusBarAlignment: { Left: 1, Right: 2 },
      Uri: {
        file: (path: string) => ({ fsPath: path }),
        from: (parts: { scheme: string; authority: string; path: string }) => ({ ...parts }),
      },
      workspace: {
        workspaceFolders: undefined,
        getConfiguration: (section: string) => ({
          get: (key: string) => (section === "xum" ? self.settings[key] : undefined),
        }),
      },
      window: {
        createStatusBarItem: () => self.status,
        registerTreeDataProvider: (id: string, provider: Provider) => {
          self.providers.set(id, provider);
          return { dispose() {} };
        },
        showErrorMessage: async (m: string) => void self.errors.push(m),
        showInformationMessage: async (m: string) => void self.infos.push(m),
        showWarningMessage: async () => undefined,
        showQuickPick: async () => undefined,
        showInputBox: async () => undefined,
        createTerminal: (options: { name?: string; cwd?: string; shellPath?: string; shellArgs?: string[] }) => {
          self.terminals.push(options);
          return { show() {} };
        },
      },
      commands: {
        registerCommand: (name: string, fn: (...args: unknown[]) => unknown) => {
          self.commands.set(name, fn);
          return { dispose() {} };
        },
        executeCommand: async (command: string, ...args: unknown[]) => void self.executed.push({ command, args }),
      },
    };
  }
}

test("the bundle activates: manifest commands registered, the tree follows the daemon, a command runs", async () => {
  await withDaemon(async (daemon, tmp) => {
    const fake = new FakeVscode({ socketPath: daemon.socketPath });
    const require = createRequire(import.meta.url);
    const Module = require("node:module") as { _load: (request: string, ...rest: unknown[]) => unknown };
    const load = Module._load;
    Module._load = (request: string, ...rest: unknown[]) => (request === "vscode" ? fake.module() : load(request, ...rest));
    const bundle = join(repoRoot(), "clients", "vscode", "dist", "extension.js");
    const disposables: { dispose(): unknown }[] = [];
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const extension = require(bundle) as { activate(ctx: unknown): void };
      extension.activate({ subscriptions: disposables });

      const manifest = JSON.parse(readFileSync(join(repoRoot(), "clients", "vscode", "package.json"), "utf8")) as {
        contributes: { commands: { command: string }[]; views: Record<string, { id: string }[]> };
      };
      assert.deepEqual(
        [...fake.commands.keys()].sort(),
        manifest.contributes.commands.map((c) => c.command).sort(),
      );
      const viewIds = Object.values(manifest.contributes.views).flat().map((v) => v.id);
      assert.deepEqual([...fake.providers.keys()], viewIds);
      const tree = fake.providers.get("xum.workspaces");
      assert.ok(tree);

      await until(() => fake.status.text === "$(layers) xum", "the status bar to say connected");
      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await other.call("project.add", { path: repo, name: "shown" });
      const { workspace } = await other.call("workspace.create", { project_id: project.id, name: "in-tree" });
      const projectNode = await until(() => tree.getChildren()[0], "the project in the tree");
      assert.equal(tree.getTreeItem(projectNode).label, "shown");
      // The tree is asked again on every change (as VS Code does): its nodes are the state then.
      const wsNode = await until(
        () =>
          tree
            .getChildren(projectNode)
            .find((n) => tree.getTreeItem(n).label === "in-tree" && tree.getTreeItem(n).description === "active"),
        "the workspace shown active in the tree",
      );

      await fake.commands.get("xum.openTerminal")?.(wsNode);
      assert.deepEqual(fake.terminals, [{ name: "xum: in-tree", cwd: workspace.path }]);
      assert.deepEqual(fake.errors, []);

      await daemon.stop();
      await until(() => fake.status.text === "$(debug-disconnect) xum", "the status bar to say disconnected");
      // Back up (another run: a new epoch): reconnected, resubscribed, the tree rebuilt from the
      // new run's snapshot, and live again.
      await daemon.start();
      await until(() => fake.status.text === "$(layers) xum", "the status bar to say connected again");
      const again = await XumClient.connect({ socketPath: daemon.socketPath });
      try {
        await again.call("workspace.create", { project_id: project.id, name: "after-restart" });
      } finally {
        await again.close();
      }
      await until(
        () => {
          const [p] = tree.getChildren();
          if (p === undefined) return false;
          const names = tree.getChildren(p).map((n) => tree.getTreeItem(n).label);
          return names.includes("in-tree") && names.includes("after-restart");
        },
        "both workspaces in the tree after the restart",
      );
    } finally {
      Module._load = load;
      for (const d of disposables) await d.dispose();
      await other.close().catch(() => undefined);
    }
  });
});

/** The bundle, activated against `fake`; `deactivate()` disposes of what it registered. */
function activateBundle(fake: FakeVscode): { deactivate(): Promise<void> } {
  const require = createRequire(import.meta.url);
  const Module = require("node:module") as { _load: (request: string, ...rest: unknown[]) => unknown };
  const load = Module._load;
  Module._load = (request: string, ...rest: unknown[]) => (request === "vscode" ? fake.module() : load(request, ...rest));
  const disposables: { dispose(): unknown }[] = [];
  // Loaded afresh: the bundle binds `vscode` when it loads, and an earlier test's is another fake.
  const bundle = join(repoRoot(), "clients", "vscode", "dist", "extension.js");
  delete require.cache[require.resolve(bundle)];
  const extension = require(bundle) as { activate(ctx: unknown): void };
  extension.activate({ subscriptions: disposables });
  return {
    async deactivate() {
      Module._load = load;
      for (const d of disposables) await d.dispose();
    },
  };
}

function manifest(): {
  repository: { url: string };
  contributes: { commands: { command: string }[]; configuration: { properties: Record<string, unknown> } };
} {
  return JSON.parse(readFileSync(join(repoRoot(), "clients", "vscode", "package.json"), "utf8"));
}

/** `fn` with these variables in process.env (undefined: unset), as they were after. */
async function withEnv<T>(vars: Record<string, string | undefined>, fn: () => Promise<T>): Promise<T> {
  const before = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const put = (values: Record<string, string | undefined>): void => {
    for (const [k, v] of Object.entries(values)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
  put(vars);
  try {
    return await fn();
  } finally {
    put(before);
  }
}

test("xum.host: the bundle reaches the host's daemon through ssh and `xum bridge`, and says which host", async (t) => {
  assert.ok("xum.host" in manifest().contributes.configuration.properties, "the manifest declares the setting");
  await withDaemon(async (daemon, tmp) => {
    const sshd = await startSshd(tmp);
    if (sshd.skip !== null) {
      t.skip(sshd.skip);
      return;
    }
    try {
      const hosts = join(tmp, "hosts.toml");
      writeFileSync(
        hosts,
        `[hosts.h]\ndest = "${sshd.alias}"\nremote_root = ${JSON.stringify(daemon.root)}\n\n[hosts.down]\ndest = "${sshd.down}"\n`,
      );
      // No local daemon to find: what the tree shows came through the host.
      const env = { ...sshd.env, XUM_HOSTS_FILE: hosts, XUM_SOCKET: undefined, XUM_ROOT: undefined, XDG_STATE_HOME: join(tmp, "state") };
      await withEnv(env, async () => {
        const fake = new FakeVscode({ host: "h" });
        const active = activateBundle(fake);
        const other = await XumClient.connect({ socketPath: daemon.socketPath });
        try {
          await until(() => fake.status.text === "$(layers) xum", "the status bar to say connected", 60_000);
          assert.equal(fake.status.tooltip, "xum: connected on host h");
          const repo = makeRepo(join(tmp, "repo"));
          const { project } = await other.call("project.add", { path: repo, name: "remote" });
          const { workspace } = await other.call("workspace.create", { project_id: project.id, name: "there" });
          const tree = fake.providers.get("xum.workspaces");
          assert.ok(tree);
          const node = await until(() => {
            const [p] = tree.getChildren();
            return p !== undefined && tree.getChildren(p).find((n) => tree.getTreeItem(n).label === "there");
          }, "the host's workspace in the tree");
          assert.deepEqual(fake.errors, []);

          // Its checkout is the host's: a window through Remote-SSH, a terminal through ssh.
          await fake.commands.get("xum.openInNewWindow")?.(node);
          assert.deepEqual(fake.executed, [
            {
              command: "vscode.openFolder",
              args: [{ scheme: "vscode-remote", authority: `ssh-remote+${sshd.alias}`, path: workspace.path }, { forceNewWindow: true }],
            },
          ]);
          await fake.commands.get("xum.openTerminal")?.(node);
          const [terminal] = fake.terminals;
          assert.equal(terminal?.name, "xum: there (h)");
          assert.equal(terminal.cwd, undefined);
          assert.ok(terminal.shellPath !== undefined && terminal.shellArgs !== undefined);
          // The shell it starts there is in the checkout (stdin is no terminal here: ssh says so
          // and goes on, the shell reading its commands from it).
          const shown = execFileSync(terminal.shellPath, terminal.shellArgs, { input: "pwd\nexit\n", encoding: "utf8", timeout: 60_000 });
          assert.equal(shown.trim().split("\n").pop(), workspace.path);
          assert.deepEqual(fake.errors, []);
        } finally {
          await other.close();
          await active.deactivate();
        }

        // A host ssh cannot reach: the status bar says which, and why.
        const down = new FakeVscode({ host: "down" });
        const inactive = activateBundle(down);
        try {
          await until(() => /unreachable/.test(String(down.status.tooltip)), "the status bar to say why", 60_000);
          assert.equal(down.status.text, "$(debug-disconnect) xum");
          assert.match(String(down.status.tooltip), /^xum: not connected to the daemon on host down: host 'down' \(.*\) is unreachable: /);
        } finally {
          await inactive.deactivate();
        }
      });
    } finally {
      await sshd.close();
    }
  });
});

test("xum.host naming no host of the hosts file: said at once, by the status bar and by every command", async () => {
  const tmp = shortTmpdir();
  try {
    const hosts = join(tmp, "hosts.toml");
    writeFileSync(hosts, '[hosts.known]\ndest = "me@known"\n');
    await withEnv({ XUM_HOSTS_FILE: hosts }, async () => {
      const fake = new FakeVscode({ host: "nope" });
      const active = activateBundle(fake);
      try {
        assert.equal(fake.errors.length, 1);
        assert.match(fake.errors[0] ?? "", /^xum: no host "nope" in .*hosts\.toml \(known: known\)/);
        assert.equal(fake.status.text, "$(error) xum");
        assert.equal(fake.status.tooltip, fake.errors[0]);
        assert.deepEqual([...fake.commands.keys()].sort(), manifest().contributes.commands.map((c) => c.command).sort());
        await fake.commands.get("xum.newWorkspace")?.();
        assert.deepEqual(fake.errors, [fake.errors[0], fake.errors[0]]);
      } finally {
        await active.deactivate();
      }
    });
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("the manifest names the project's repository", () => {
  assert.equal(manifest().repository.url, "https://github.com/xum-dev/xum");
});
