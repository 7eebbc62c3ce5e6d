// The extension's commands, through the client, against a real xumd. The UI is scripted (the
// one part that cannot be real here: VS Code itself); everything it asks the daemon is real.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { HostUnreachable, XumClient, XumRpcError, type WorkspaceInfo } from "../../ts/src/index.js";
import { makeRepo, until, withDaemon, type Daemon } from "../../ts/test/support/daemon.js";
import { Commands, validateName, type PickItem, type TerminalPlace, type Ui } from "../src/logic/commands.js";
import { formatError, statusBarText, workspaceLabel } from "../src/logic/format.js";
import { WorkspaceModel } from "../src/logic/model.js";
import { remoteAuthority, terminalCommand } from "../src/logic/remote.js";
import { ModelSync } from "../src/logic/sync.js";

/** A UI whose answers are given in advance; it records what it was asked and shown. */
class ScriptedUi implements Ui {
  readonly errors: string[] = [];
  readonly infos: string[] = [];
  readonly asked: string[] = [];
  readonly opened: { path: string; newWindow: boolean; authority?: string }[] = [];
  readonly terminals: ({ name: string } & TerminalPlace)[] = [];

  constructor(private readonly answers: unknown[] = []) {}

  private next(what: string): unknown {
    this.asked.push(what);
    if (this.answers.length === 0) throw new Error(`unexpected question: ${what}`);
    return this.answers.shift();
  }
  async pick<T>(items: PickItem<T>[], placeholder: string): Promise<T | undefined> {
    const label = this.next(`pick: ${placeholder}`);
    return items.find((i) => i.label === label)?.value;
  }
  async input(prompt: string, validate: (v: string) => string | null): Promise<string | undefined> {
    const value = this.next(`input: ${prompt}`) as string | undefined;
    if (value !== undefined && validate(value) !== null) return undefined;
    return value;
  }
  async confirm(message: string): Promise<boolean> {
    return this.next(`confirm: ${message}`) as boolean;
  }
  info(message: string): void {
    this.infos.push(message);
  }
  error(message: string): void {
    this.errors.push(message);
  }
  async openFolder(path: string, newWindow: boolean, authority?: string): Promise<void> {
    this.opened.push(authority === undefined ? { path, newWindow } : { path, newWindow, authority });
  }
  openTerminal(name: string, place: TerminalPlace): void {
    this.terminals.push({ name, ...place });
  }
}

/** `fn` with a client of a fresh real daemon, closed after it whatever happens. */
async function withClient<T>(fn: (client: XumClient, tmp: string, daemon: Daemon) => Promise<T>): Promise<T> {
  return withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      return await fn(client, tmp, daemon);
    } finally {
      await client.close();
    }
  });
}

test("new (project picked, name asked), open in a new window, terminal, archive, unarchive, remove", async () => {
  await withClient(async (client, tmp) => {
    const repo = makeRepo(join(tmp, "repo"));
    await client.call("project.add", { path: repo, name: "app" });

    const ui = new ScriptedUi(["app", "feature-x"]);
    const created = await new Commands(client, ui).newWorkspace();
    assert.ok(created, ui.errors.join("\n"));
    assert.equal(created.name, "feature-x");
    assert.equal(created.state, "active");
    assert.ok(existsSync(created.path));
    assert.deepEqual(ui.asked, ["pick: Project for the new workspace", "input: Name of the new workspace"]);
    assert.match(ui.infos[0] ?? "", /created at/);

    const commands = new Commands(client, ui);
    assert.equal(await commands.openInNewWindow(created), true);
    assert.deepEqual(ui.opened, [{ path: created.path, newWindow: true }]);
    assert.equal(await commands.openTerminal(created), true);
    assert.deepEqual(ui.terminals, [{ name: "xum: feature-x", cwd: created.path }]);

    const archived = await commands.archive(created);
    assert.equal(archived?.workspace.state, "archived");
    assert.ok(!existsSync(created.path), "the checkout is gone after the archive");
    assert.match(ui.infos.at(-1) ?? "", /'feature-x' archived/);

    // An archived workspace has no checkout to open: said so, nothing opened.
    assert.equal(await commands.openTerminal(created), false);
    assert.match(ui.errors.at(-1) ?? "", /is archived: .*unarchive it first/);
    assert.equal(ui.terminals.length, 1);

    const restored = await commands.unarchive(created);
    assert.equal(restored?.workspace.state, "active");
    assert.ok(existsSync(created.path));

    const removeUi = new ScriptedUi([true]);
    const removed = await new Commands(client, removeUi).remove(created);
    assert.equal(removed?.removed, true);
    await assert.rejects(client.call("workspace.get", { workspace_id: created.id }), /not found/);
  });
});

test("a failed setup is an error after an unarchive as after a create", async () => {
  await withClient(async (client, tmp) => {
    const repo = makeRepo(join(tmp, "repo"), { ".xum/config.toml": '[scripts]\nsetup = ["exit 3"]\n' });
    const { project } = await client.call("project.add", { path: repo, name: "app" });
    await client.call("project.trust", { project_id: project.id });
    const ui = new ScriptedUi(["setup-fails"]);
    const commands = new Commands(client, ui);
    const created = await commands.newWorkspace(project.id);
    assert.ok(created, ui.errors.join("\n"));
    assert.match(ui.errors.at(-1) ?? "", /'setup-fails' created, but its setup failed/);
    await client.call("workspace.archive", { workspace_id: created.id });
    const restored = await commands.unarchive(created);
    assert.equal(restored?.workspace.state, "active");
    assert.match(ui.errors.at(-1) ?? "", /'setup-fails' restored, but its setup failed/);
  });
});

test("an unarchive whose preserved file cannot be put back says where the copy is kept", async () => {
  await withClient(async (client, tmp) => {
    // The branch's setup (trusted) makes a directory where the preserved `.env.local` goes.
    const repo = makeRepo(join(tmp, "repo"), {
      ".gitignore": ".env.local\n",
      ".xum/config.toml": '[scripts]\npreserve = [".env*"]\n',
    });
    const { project } = await client.call("project.add", { path: repo, name: "app" });
    const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "kept" });
    writeFileSync(join(workspace.path, ".env.local"), "LOCAL=1\n");
    await client.call("workspace.archive", { workspace_id: workspace.id });
    const config = '[scripts]\nsetup = ["rm -f .env.local; mkdir .env.local"]\npreserve = [".env*"]\n';
    const git = (...args: string[]): void => {
      execFileSync("git", args, {
        cwd: repo,
        stdio: "ignore",
        env: { ...process.env, GIT_AUTHOR_NAME: "t", GIT_AUTHOR_EMAIL: "t@example.invalid", GIT_COMMITTER_NAME: "t", GIT_COMMITTER_EMAIL: "t@example.invalid" },
      });
    };
    git("checkout", "-q", "xum/kept");
    writeFileSync(join(repo, ".xum", "config.toml"), config);
    git("commit", "-q", "-am", "setup makes a directory");
    git("checkout", "-q", "main");
    const hash = createHash("sha256").update(config).digest("hex");
    await client.call("project.trust", { project_id: project.id, hash });

    const ui = new ScriptedUi();
    const restored = await new Commands(client, ui).unarchive(workspace);
    assert.equal(restored?.workspace.state, "active");
    const kept = restored?.restored.kept_at ?? "";
    assert.ok(kept, "the daemon kept the copy");
    assert.match(ui.errors.at(-1) ?? "", /'kept' restored, but not in place: \.env\.local; your saved copy is kept at /);
    assert.ok((ui.errors.at(-1) ?? "").endsWith(kept));
  });
});

test("refresh lists every project and workspace; a failure is shown, not thrown", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath });
    const ui = new ScriptedUi();
    const commands = new Commands(client, ui);
    try {
      const { project } = await client.call("project.add", { path: makeRepo(join(tmp, "repo")) });
      await client.call("workspace.create", { project_id: project.id, name: "listed" });
      const all = await commands.listAll();
      assert.deepEqual(all?.projects.map((p) => p.id), [project.id]);
      assert.deepEqual(all?.workspaces.map((w) => w.name), ["listed"]);
    } finally {
      await client.close();
    }
    assert.equal(await commands.listAll(), undefined);
    assert.match(ui.errors.at(-1) ?? "", /closed/);
  });
});

test("remove refused not_safe: the error is shown, and Remove anyway forces it only when confirmed", async () => {
  await withClient(async (client, tmp) => {
    const repo = makeRepo(join(tmp, "repo"));
    const { project } = await client.call("project.add", { path: repo });
    const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "dirty" });
    writeFileSync(join(workspace.path, "work.txt"), "not committed\n");

    const declined = new ScriptedUi([true, false]);
    assert.equal(await new Commands(client, declined).remove(workspace), undefined);
    assert.match(declined.errors[0] ?? "", /not_safe/);
    assert.match(declined.asked[1] ?? "", /Remove 'dirty' anyway\? .*work\.txt/);
    assert.equal((await client.call("workspace.get", { workspace_id: workspace.id })).workspace.state, "active");

    const forced = new ScriptedUi([true, true]);
    const removed = await new Commands(client, forced).remove(workspace);
    assert.equal(removed?.removed, true, forced.errors.join("\n"));
    assert.match(forced.infos.at(-1) ?? "", /'dirty' removed/);
  });
});

test("archive refused busy: the error names its kind and each holder; Stop and archive is offered", async () => {
  await withClient(async (client, tmp, daemon) => {
    const repo = makeRepo(join(tmp, "repo"));
    const { project } = await client.call("project.add", { path: repo });
    const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "busy-one" });
    // A process the daemon runs in it (stop: true can stop it) ...
    const { process: agent } = await client.call("process.spawn", {
      workspace_id: workspace.id,
      kind: "agent",
      argv: ["sleep", "60"],
      label: "claude",
    });

    // The user declines: nothing changes, and the error said why.
    const declined = new ScriptedUi([false]);
    assert.equal(await new Commands(client, declined).archive(workspace), undefined);
    assert.equal(declined.errors.length, 1);
    const message = declined.errors[0] ?? "";
    assert.match(message, /^xum: busy: /);
    assert.match(message, new RegExp(`agent in pid ${agent.pid}`));
    assert.match(declined.asked[0] ?? "", /Stop the processes xum runs in 'busy-one'/);
    assert.equal((await client.call("workspace.get", { workspace_id: workspace.id })).workspace.state, "active");

    // The user accepts: the archive stops the agent and says so.
    const accepted = new ScriptedUi([true]);
    const result = await new Commands(client, accepted).archive(workspace);
    assert.equal(result?.workspace.state, "archived");
    assert.deepEqual(result?.stopped, [agent.id]);
    assert.match(accepted.infos.at(-1) ?? "", new RegExp(`stopped ${agent.id}`));
  });
});

test("a holder the daemon does not run (a lease) still refuses after Stop and archive", async () => {
  await withClient(async (client, tmp) => {
    const repo = makeRepo(join(tmp, "repo"));
    const { project } = await client.call("project.add", { path: repo });
    const { workspace } = await client.call("workspace.create", { project_id: project.id, name: "leased" });
    await client.call("lease.acquire", { workspace_id: workspace.id, kind: "editor", pid: process.pid, label: "vim" });
    const ui = new ScriptedUi([true]);
    assert.equal(await new Commands(client, ui).archive(workspace), undefined);
    assert.equal(ui.errors.length, 2, ui.errors.join("\n"));
    for (const error of ui.errors) assert.match(error, new RegExp(`busy: .*editor in pid ${process.pid} \\(vim\\)`));
    assert.equal((await client.call("workspace.get", { workspace_id: workspace.id })).workspace.state, "active");
  });
});

test("errors from the daemon are shown with their kind: a bad name, a name taken, no daemon", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath, reconnect: false });
    const repo = makeRepo(join(tmp, "repo"));
    const { project } = await client.call("project.add", { path: repo });
    await client.call("workspace.create", { project_id: project.id, name: "taken" });

    const ui = new ScriptedUi(["taken"]);
    assert.equal(await new Commands(client, ui).newWorkspace(project.id), undefined);
    assert.match(ui.errors[0] ?? "", /^xum: conflict: /);

    // The UI's own check stops a bad name before the daemon is asked.
    assert.equal(validateName("../x"), "letters, digits, '.', '_' and '-' only");
    assert.equal(validateName("-x"), "must not start with '.' or '-'");
    assert.equal(validateName("a..b"), "must not contain '..'");
    assert.equal(validateName("ok-name_1.2"), null);

    await client.close();
    await daemon.stop();
    const gone = new XumClient({ socketPath: daemon.socketPath, reconnect: false, timeoutMs: 2000 });
    const downUi = new ScriptedUi([]);
    assert.equal(await new Commands(gone, downUi).newWorkspace(), undefined);
    assert.match(downUi.errors[0] ?? "", /the daemon is not running/);
    await gone.close();
  });
});

test("the tree model follows the daemon: snapshot, then events; status bar and labels", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath });
    const other = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const repo = makeRepo(join(tmp, "repo"));
      const { project } = await other.call("project.add", { path: repo, name: "tree" });
      const model = new WorkspaceModel();
      let changes = 0;
      await new ModelSync(client, model, () => changes++).subscribe();
      assert.ok(changes > 0);
      assert.deepEqual(
        model.projectList().map((p) => p.name),
        ["tree"],
      );

      const { workspace } = await other.call("workspace.create", { project_id: project.id, name: "w1" });
      await until(() => model.workspaces.get(workspace.id)?.state === "active", "w1 active in the model");
      assert.deepEqual(
        model.workspacesOf(project.id).map((w) => w.name),
        ["w1"],
      );
      const inside = join(workspace.path, "src", "main.ts");
      assert.equal(model.workspaceAt(inside)?.id, workspace.id);
      assert.equal(model.workspaceAt(workspace.path + "-other"), null);
      const bar = statusBarText(true, model.workspaceAt(workspace.path), model.pendingCleanups());
      assert.equal(bar.text, "$(layers) w1 · active");
      assert.equal(statusBarText(false, null, 0).text, "$(debug-disconnect) xum");

      await other.call("workspace.archive", { workspace_id: workspace.id });
      await until(() => model.workspaces.get(workspace.id)?.state === "archived", "w1 archived in the model");
      // The checkout's deletion may finish after the state change: its completion is an event too.
      await until(
        () => model.workspaces.get(workspace.id)?.last_cleanup?.status === "completed",
        "w1's cleanup completed in the model",
      );
      const label = workspaceLabel(model.workspaces.get(workspace.id) as WorkspaceInfo);
      assert.equal(label.contextValue, "workspace-archived");
      assert.match(label.description, /^archived/);

      await other.call("workspace.remove", { workspace_id: workspace.id });
      await until(() => !model.workspaces.has(workspace.id), "w1 gone from the model");
    } finally {
      await client.close();
      await other.close();
    }
  });
});

test("labels: cleanup pending is shown in the tree and counted in the status bar", () => {
  const ws = {
    id: "ws_0123456789abcdef",
    project_id: "prj_0123456789abcdef",
    name: "w",
    runtime: "worktree",
    path: "/tmp/w",
    branch: "w",
    base: "main",
    state: "archived",
    incarnation: "x",
    interrupted: false,
    setup: { status: "ok" },
    created_at: 0,
    updated_at: 0,
    last_cleanup: { status: "pending", attempts: 2, next_attempt_at: 130, last_error: "busy: editor in pid 7", obligations: [] },
  } satisfies WorkspaceInfo;
  const label = workspaceLabel(ws, 100);
  assert.equal(label.contextValue, "workspace-archived-cleanup");
  assert.equal(label.description, "archived · cleanup pending");
  assert.match(label.tooltip, /cleanup pending \(attempt 2, next in 30 s\): busy: editor in pid 7/);
  const model = new WorkspaceModel();
  model.reset({ workspaces: [ws], projects: [] });
  assert.equal(model.pendingCleanups(), 1);
  assert.equal(statusBarText(true, null, 1).text, "$(layers) xum $(sync~spin) 1");
  assert.match(formatError(new Error("boom")), /^xum: boom$/);
  // A mount holder has no pid: its label says where; a project removal names each workspace.
  const busy = new XumRpcError({
    code: -32002,
    message: "cannot remove 'p': busy",
    data: {
      kind: "busy",
      holders: [
        { kind: "mount", pid: null, label: "mount at /w/a/m", since: null },
        { kind: "terminal", pid: 42, label: "bash", since: 1, workspace: "ws_0123456789abcdef" },
      ],
    },
  });
  assert.equal(
    formatError(busy),
    "xum: busy: cannot remove 'p': busy — held by mount at /w/a/m; terminal in pid 42 (bash) [ws_0123456789abcdef]. " +
      "Stop them (or archive with stop) and try again.",
  );
  // A kind newer than this client: kept as the daemon said it.
  const novel = new XumRpcError({ code: -32050, message: "m", data: { kind: "brand_new" } });
  assert.equal(formatError(novel), "xum: brand_new: m");
});

test("a host that cannot be reached is shown with its kind, as the daemon's errors are", () => {
  const down = new HostUnreachable("host 'down' (me@down) is unreachable: Connection refused", "down", 255, "Connection refused");
  assert.equal(formatError(down), "xum: host_unreachable: host 'down' (me@down) is unreachable: Connection refused");
});

test("a host's remote authority is Remote-SSH's: the destination, hex-encoded JSON when it is no plain lower-case name", () => {
  assert.equal(remoteAuthority({ name: "d", dest: "devbox.lan" }), "ssh-remote+devbox.lan");
  const hex = (dest: string): string => Buffer.from(JSON.stringify({ hostName: dest })).toString("hex");
  assert.equal(remoteAuthority({ name: "d", dest: "me@DevBox" }), `ssh-remote+${hex("me@DevBox")}`);
  assert.equal(remoteAuthority({ name: "d", dest: "me@devbox" }), `ssh-remote+${hex("me@devbox")}`);
});

test("a terminal on a host: ssh as xum --host runs it, with a terminal, into the checkout quoted for the shell", () => {
  const entry = { name: "d", dest: "me@devbox", sshOptions: { Port: "2222" } };
  assert.deepEqual(terminalCommand(entry, "/srv/x y/it's", { XUM_SSH: "ssh -F '/tmp/my config'" }), [
    "ssh",
    "-F",
    "/tmp/my config",
    "-t",
    "-o",
    "Port=2222",
    "--",
    "me@devbox",
    `cd '/srv/x y/it'"'"'s' && exec "\${SHELL:-sh}" -l`,
  ]);
});
