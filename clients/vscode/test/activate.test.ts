// The packaged bundle (dist/extension.js, what the .vsix holds) loads and activates against a real
// daemon. VS Code itself cannot run here: `vscode` is a recording stand-in with just the API the
// extension uses. What this proves: the bundle loads, it registers exactly the commands its
// manifest declares, its tree shows the daemon's projects and workspaces live, the status bar
// tells connected from not, and a tree command reaches the daemon.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { test } from "node:test";

import { XumClient } from "../../ts/src/index.js";
import { makeRepo, repoRoot, until, withDaemon } from "../../ts/test/support/daemon.js";

type Provider = { getChildren(node?: unknown): unknown[]; getTreeItem(node: unknown): { label?: unknown; description?: unknown } };

class FakeVscode {
  commands = new Map<string, (...args: unknown[]) => unknown>();
  providers = new Map<string, Provider>();
  status = { text: "", tooltip: "" as unknown, command: "" as unknown, show() {}, dispose() {} };
  terminals: { name?: string; cwd?: string }[] = [];
  errors: string[] = [];
  infos: string[] = [];

  constructor(private readonly socketPath: string) {}

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
      Uri: { file: (path: string) => ({ fsPath: path }) },
      workspace: {
        workspaceFolders: undefined,
        getConfiguration: () => ({ get: (key: string) => (key === "socketPath" ? self.socketPath : undefined) }),
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
        createTerminal: (options: { name?: string; cwd?: string }) => {
          self.terminals.push(options);
          return { show() {} };
        },
      },
      commands: {
        registerCommand: (name: string, fn: (...args: unknown[]) => unknown) => {
          self.commands.set(name, fn);
          return { dispose() {} };
        },
        executeCommand: async () => undefined,
      },
    };
  }
}

test("the bundle activates: manifest commands registered, the tree follows the daemon, a command runs", async () => {
  await withDaemon(async (daemon, tmp) => {
    const fake = new FakeVscode(daemon.socketPath);
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
