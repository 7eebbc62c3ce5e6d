// Typed errors and how a holder is described (no daemon needed).

import assert from "node:assert/strict";
import { test } from "node:test";

import { describeHolder } from "../src/index.js";

test("a holder's self-chosen name is shown with its control characters escaped", () => {
  const text = describeHolder({ kind: "process", pid: 42, label: "\x1b[31mevil\nname" });
  assert.equal(text, "process in pid 42 (\\x1b[31mevil\\x0aname)");
  assert.equal(describeHolder({ kind: "mount", pid: null, label: "mount at /w/a\tb" }), "mount at /w/a\\x09b");
  assert.equal(describeHolder({ kind: "agent", pid: 7, label: "claude" }), "agent in pid 7 (claude)");
});
