// iterWorkspaces against a real xumd: every page, in the listing order, filters kept.

import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";

import { XumClient, XumRpcError, iterWorkspaces } from "../src/index.js";
import { makeRepo, withDaemon } from "./support/daemon.js";

test("iterWorkspaces walks every page of workspace.list", async () => {
  await withDaemon(async (daemon, tmp) => {
    const client = await XumClient.connect({ socketPath: daemon.socketPath });
    try {
      const one = (await client.call("project.add", { path: makeRepo(join(tmp, "one")) })).project.id;
      const two = (await client.call("project.add", { path: makeRepo(join(tmp, "two")) })).project.id;
      for (let i = 0; i < 5; i++) {
        await client.call("workspace.create", { project_id: i % 2 ? one : two, name: `w${i}`, runtime: "directory" });
      }
      const full = (await client.call("workspace.list", {})).workspaces.map((w) => w.id);
      assert.equal(full.length, 5);
      const first = await client.call("workspace.list", { limit: 2 });
      assert.equal(first.workspaces.length, 2);
      assert.match(first.next ?? "", /^c2\./);

      const asked: unknown[] = [];
      const spy = {
        call: ((method: "workspace.list", params: Record<string, unknown>) => {
          asked.push(params);
          return client.call(method, params);
        }) as XumClient["call"],
      };
      const got: string[] = [];
      for await (const w of iterWorkspaces(spy, {}, 2)) got.push(w.id);
      assert.deepEqual(got, full);
      assert.equal(asked.length, 3, "pages of 2, 2 and 1");

      const mine: string[] = [];
      for await (const w of iterWorkspaces(client, { project_id: one }, 1)) mine.push(w.id);
      const expected = (await client.call("workspace.list", { project_id: one })).workspaces.map((w) => w.id);
      assert.deepEqual(mine, expected);

      const bad = await client.call("workspace.list", { after: "bogus" }).then(
        () => assert.fail("a bad cursor was accepted"),
        (e: unknown) => e,
      );
      assert.ok(bad instanceof XumRpcError);
      assert.equal(bad.kind, "invalid_params");
    } finally {
      await client.close();
    }
  });
});

test("iterWorkspaces refuses a next that would end or loop the listing", async () => {
  // A stand-in for a broken daemon (a real one never answers so): the first page's `next` is
  // "same", the second's the bad value.
  for (const bad of [5, ["c2.1"], { c: 1 }, "same"]) {
    const asked: unknown[] = [];
    const broken = {
      call: (async (_method: string, params: Record<string, unknown>) => {
        asked.push(params["after"]);
        return params["after"] === undefined
          ? { workspaces: [{ id: "ws_1" }], next: "same" }
          : { workspaces: [{ id: "ws_2" }], next: bad };
      }) as unknown as XumClient["call"],
    };
    const got: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const w of iterWorkspaces(broken, {}, 1)) got.push(w.id);
      })(),
      bad === "same" ? /same cursor twice/ : /no cursor/,
    );
    assert.deepEqual(got, ["ws_1", "ws_2"]);
    assert.deepEqual(asked, [undefined, "same"]);
  }
});
