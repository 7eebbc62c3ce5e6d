// The MCP TypeScript SDK's own client (Client + StdioClientTransport) driving `xum mcp` against a
// real daemon (tests/agents/test_mcp_typescript.py starts it and passes what this needs):
//
//   node client.mjs XUM ROOT PROJECT_ID
//
// It lists the tools, creates a workspace, leaves uncommitted work in it, sees `busy` while a
// supervised process holds it, archives it (the snapshot holds the work), reads the cleanup
// status, gets a resource notification, and checks that bad input is a clear tool error. Each
// step is asserted here; the last line on stdout is a JSON report the Python test checks too.

import assert from "node:assert/strict";
import { writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [xum, root, projectId] = process.argv.slice(2);
const DEADLINE_MS = 20000;

function errorOf(result) {
  // A tool error: its text ends with the error object's JSON; never a stack trace.
  assert.equal(result.isError, true, JSON.stringify(result));
  const text = result.content.map((c) => c.text ?? "").join("");
  assert.ok(!text.includes("Traceback"), text);
  return JSON.parse(text.trim().split("\n").at(-1)).error;
}

function structured(result) {
  assert.notEqual(result.isError, true, JSON.stringify(result.content));
  assert.ok(result.structuredContent, "structured content");
  return result.structuredContent;
}

// Notifications as they come, and a wait for one with a deadline.
const updates = [];
const waiters = [];
function waitForUpdate(uri) {
  const found = updates.indexOf(uri);
  if (found >= 0) {
    updates.splice(found, 1);
    return Promise.resolve();
  }
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no update of ${uri}`)), DEADLINE_MS);
    waiters.push({ uri, resolve: () => (clearTimeout(timer), resolve()) });
  });
}

const env = { ...process.env };
delete env.XUM_WORKSPACE_ID;
const transport = new StdioClientTransport({
  command: xum,
  args: ["--root", root, "mcp"],
  env,
  stderr: "inherit",
});
const client = new Client({ name: "xum-ts-test", version: "1.0.0" });
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (note) => {
  const at = waiters.findIndex((w) => w.uri === note.params.uri);
  if (at >= 0) waiters.splice(at, 1)[0].resolve();
  else updates.push(note.params.uri);
});
await client.connect(transport);
const report = {};

try {
  const { tools } = await client.listTools();
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  report.tools = Object.keys(byName).sort();
  assert.equal(byName.archive_workspace.annotations.destructiveHint, true);
  assert.equal(byName.remove_workspace.annotations.destructiveHint, true);
  assert.equal(byName.list_workspaces.annotations.readOnlyHint, true);
  assert.deepEqual(byName.archive_workspace.inputSchema.required, ["workspace_id"]);
  assert.ok(byName.archive_workspace.outputSchema.properties.cleanup);

  const created = structured(
    await client.callTool({
      name: "create_workspace",
      arguments: { project_id: projectId, name: "ts-agent" },
    }),
  );
  const ws = created.workspace;
  assert.equal(ws.state, "active");
  writeFileSync(join(ws.path, "README.md"), "edited by the agent\n");
  writeFileSync(join(ws.path, "wip.txt"), "work in progress\n");
  const uri = `xum://workspace/${ws.id}`;
  await client.subscribeResource({ uri });

  // A supervised process in the checkout holds it: archive is refused `busy`, naming it.
  const proc = structured(
    await client.callTool({
      name: "start_process",
      arguments: { workspace_id: ws.id, kind: "agent", argv: ["sleep", "600"] },
    }),
  ).process;
  const busy = errorOf(
    await client.callTool({ name: "archive_workspace", arguments: { workspace_id: ws.id } }),
  );
  assert.equal(busy.kind, "busy");
  assert.ok(busy.data.holders.some((h) => h.process_id === proc.id), JSON.stringify(busy));
  assert.ok(busy.free.some((f) => f.includes(`stop_process {process_id: ${proc.id}}`)));
  assert.ok(existsSync(join(ws.path, "wip.txt")), "nothing was changed");
  report.busy = busy;

  const stopped = structured(
    await client.callTool({ name: "stop_process", arguments: { process_id: proc.id } }),
  );
  assert.equal(stopped.process.state, "exited");

  const archived = structured(
    await client.callTool({ name: "archive_workspace", arguments: { workspace_id: ws.id } }),
  );
  assert.equal(archived.workspace.state, "archived");
  assert.deepEqual([...archived.snapshot.files].sort(), ["README.md", "wip.txt"]);
  assert.equal(archived.cleanup.status, "completed");
  assert.ok(!existsSync(ws.path), "the checkout went");
  report.archived = archived;
  await waitForUpdate(uri);

  // The checkout went (cleanup completed); the trashed copy's reclaim may still run.
  assert.ok(["completed", "pending"].includes(archived.cleanup.reclaim.status));
  const status = structured(
    await client.callTool({ name: "cleanup_status", arguments: { workspace_id: ws.id } }),
  );
  assert.ok(status.obligations.length > 0);
  for (const o of status.obligations) {
    assert.equal(o.workspace_id, ws.id);
    if (o.state !== "completed") assert.deepEqual([o.kind, o.state], ["reclaim", "pending"]);
  }
  report.cleanup = status;

  const read = await client.readResource({ uri });
  assert.equal(JSON.parse(read.contents[0].text).workspace.state, "archived");

  // Bad input: a clear tool error with the protocol's kind.
  report.errors = {
    unknown_tool: errorOf(await client.callTool({ name: "no_such_tool", arguments: {} })).kind,
    wrong_type: errorOf(
      await client.callTool({ name: "archive_workspace", arguments: { workspace_id: 7 } }),
    ).kind,
    unknown_workspace: errorOf(
      await client.callTool({
        name: "show_workspace",
        arguments: { workspace_id: "ws_0000000000000000" },
      }),
    ).kind,
  };
  assert.deepEqual(report.errors, {
    unknown_tool: "method_not_found",
    wrong_type: "invalid_params",
    unknown_workspace: "not_found",
  });
} finally {
  await client.close();
}
console.log(JSON.stringify(report));
