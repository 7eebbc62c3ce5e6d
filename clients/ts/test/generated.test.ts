// The committed types are what the generator makes of the committed schema: `make schema` without
// `npm run gen` fails here.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { repoRoot, shortTmpdir } from "./support/daemon.js";

const pkg = join(repoRoot(), "clients", "ts");
const script = join(pkg, "scripts", "gen-types.mjs");
const schema = join(repoRoot(), "protocol", "schema", "xum-protocol.schema.json");
const generated = join(pkg, "src", "generated", "protocol.ts");

function check(schemaPath: string): { status: number | null; stderr: string } {
  const run = spawnSync(process.execPath, [script, "--check", schemaPath, generated], { encoding: "utf8" });
  return { status: run.status, stderr: run.stderr };
}

test("src/generated/protocol.ts is up to date with the protocol's schema", () => {
  const { status, stderr } = check(schema);
  assert.equal(status, 0, stderr);
});

test("the check fails when the schema changed (a new method)", () => {
  const tmp = shortTmpdir();
  try {
    const changed = JSON.parse(readFileSync(schema, "utf8")) as { methods: Record<string, unknown> };
    changed.methods["workspace.frobnicate"] = {
      params: { type: "object", properties: { workspace_id: { type: "string" } }, required: ["workspace_id"], title: "FrobParams" },
      result: { type: "object", properties: {}, title: "FrobResult" },
      summary: "not a real method",
    };
    const path = join(tmp, "schema.json");
    writeFileSync(path, JSON.stringify(changed));
    const { status, stderr } = check(path);
    assert.equal(status, 1);
    assert.match(stderr, /stale: run `npm run gen`/);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("the generator refuses a schema keyword it does not understand (never a silent any)", () => {
  const tmp = shortTmpdir();
  try {
    const changed = JSON.parse(readFileSync(schema, "utf8")) as { methods: Record<string, unknown> };
    changed.methods["x.y"] = {
      params: { type: "object", properties: { a: { if: { type: "string" } } }, title: "XyParams" },
      result: { type: "object", title: "XyResult" },
    };
    const path = join(tmp, "schema.json");
    writeFileSync(path, JSON.stringify(changed));
    const { status, stderr } = check(path);
    assert.notEqual(status, 0);
    assert.match(stderr, /unhandled JSON Schema keyword if/);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test("two different definitions under one name are both kept (told apart by method), never merged", () => {
  const tmp = shortTmpdir();
  try {
    const def = (field: string) => ({
      $defs: { Thing: { type: "object", properties: { [field]: { type: "string" } }, required: [field], title: "Thing" } },
      type: "object",
      properties: { thing: { $ref: "#/$defs/Thing" } },
      required: ["thing"],
    });
    const schema = {
      protocol: "9.9",
      errors: { busy: -32002 },
      methods: {
        "a.get": { params: { type: "object", title: "AParams" }, result: { ...def("alpha"), title: "AResult" } },
        "b.get": { params: { type: "object", title: "BParams" }, result: { ...def("beta"), title: "BResult" } },
      },
    };
    const path = join(tmp, "schema.json");
    const out = join(tmp, "out.ts");
    writeFileSync(path, JSON.stringify(schema));
    const run = spawnSync(process.execPath, [script, path, out], { encoding: "utf8" });
    assert.equal(run.status, 0, run.stderr);
    const text = readFileSync(out, "utf8");
    assert.match(text, /export interface Thing \{\n {2}alpha: string;\n\}/);
    assert.match(text, /export interface ThingBGet \{\n {2}beta: string;\n\}/);
    assert.match(text, /export interface BResult \{\n {2}thing: ThingBGet;\n\}/);
    assert.match(text, /export interface AResult \{\n {2}thing: Thing;\n\}/);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
