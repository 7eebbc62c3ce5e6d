// The extension on a root larger than one page: the tree's snapshot and the Refresh command's
// listing come in pages (protocol 1.3), so a client whose frame cap the whole listing would pass
// still shows every workspace. And how a call cut by a lost connection is shown.

import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { ConnectionLost, XumClient } from "../../ts/src/index.js";
import { Daemon, populate, shortTmpdir } from "../../ts/test/support/daemon.js";
import { Commands, type PickItem, type Ui } from "../src/logic/commands.js";
import { formatError } from "../src/logic/format.js";
import { WorkspaceModel } from "../src/logic/model.js";
import { ModelSync } from "../src/logic/sync.js";

const COUNT = 1203;

class QuietUi implements Ui {
  readonly errors: string[] = [];
  async pick<T>(_items: PickItem<T>[], placeholder: string): Promise<T | undefined> {
    throw new Error(`unexpected question: ${placeholder}`);
  }
  async input(prompt: string): Promise<string | undefined> {
    throw new Error(`unexpected question: ${prompt}`);
  }
  async confirm(message: string): Promise<boolean> {
    throw new Error(`unexpected question: ${message}`);
  }
  info(): void {}
  error(message: string): void {
    this.errors.push(message);
  }
  async openFolder(): Promise<void> {}
  openTerminal(): void {}
}

test("a root of 1,203 workspaces: the tree and Refresh show them all under a frame cap the whole would pass", async () => {
  const tmp = shortTmpdir();
  const daemon = new Daemon(join(tmp, "r"));
  try {
    const project = populate(daemon.root, COUNT);
    await daemon.start();
    const probe = await XumClient.connect({ socketPath: daemon.socketPath });
    let cap = 0;
    try {
      // The whole listing in one answer: what the extension asked for before it paged.
      const whole = await probe.call("workspace.list");
      assert.equal(whole.workspaces.length, COUNT);
      cap = Math.floor(JSON.stringify(whole).length * 0.6);
    } finally {
      await probe.close();
    }
    const client = await XumClient.connect({ socketPath: daemon.socketPath, maxFrameBytes: cap });
    try {
      const model = new WorkspaceModel();
      await new ModelSync(client, model, () => undefined).subscribe();
      assert.equal(model.workspaces.size, COUNT);
      assert.equal(model.workspacesOf(project).length, COUNT);

      const ui = new QuietUi();
      const all = await new Commands(client, ui).listAll();
      assert.deepEqual(ui.errors, []);
      assert.equal(all?.workspaces.length, COUNT);
      assert.deepEqual(new Set(all?.workspaces.map((w) => w.id)), new Set(model.workspaces.keys()));
    } finally {
      await client.close();
    }
  } finally {
    await daemon.close();
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("a lost call is shown as the client names it: sent (may have run) or not sent (never seen)", () => {
  const sent = ConnectionLost.during("workspace.archive", true, "the daemon closed the connection");
  const unsent = ConnectionLost.during("workspace.archive", false, "the daemon closed the connection");
  assert.match(formatError(sent), /^xum: connection lost: workspace\.archive was sent .* may or may not have done it/);
  assert.match(formatError(unsent), /^xum: connection lost: workspace\.archive was not sent: .* never saw it$/);
  assert.doesNotMatch(formatError(unsent), /may or may not/);
  assert.match(formatError(new ConnectionLost("gone")), /may or may not have run/);
});
