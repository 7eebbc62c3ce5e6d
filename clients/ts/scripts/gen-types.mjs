#!/usr/bin/env node
// Generates src/generated/protocol.ts from the protocol's JSON Schema
// (protocol/schema/xum-protocol.schema.json, written by `make schema`).
//
//   node scripts/gen-types.mjs SCHEMA OUT           write OUT
//   node scripts/gen-types.mjs --check SCHEMA OUT   exit 1 when OUT differs from what SCHEMA gives
//
// The schema is what pydantic emits: each method's params and result is a schema with its own
// `$defs`; the same model appears in many of them. Every named schema becomes one exported type
// (deduplicated by name; two different schemas under one name are told apart by the method they
// came from, never silently merged). Only the JSON Schema subset pydantic uses is handled; anything
// else fails loudly, so a schema change the generator does not understand cannot turn into `any`.
//
// Why not json-schema-to-typescript (16.0.0) behind a thin method/event map: measured on this
// schema, its output is 2,845 lines to these 2,214, with 35 declarations more (numbered copies such
// as `LeaseInfo1` where a `$ref` carries its own description) and 155 `[k: string]: unknown`
// index signatures (every result allows unknown fields), under which a misspelt field
// (`result.pendng`) compiles; here it is TS2551. Matching that would take schema rewriting in the
// wrapper, on top of 12 packages (25 MB) where this needs none.

import { readFileSync, writeFileSync } from "node:fs";
import process from "node:process";

const HANDLED = new Set([
  "$defs", "$ref", "additionalProperties", "anyOf", "const", "default", "description", "enum",
  "exclusiveMaximum", "exclusiveMinimum", "items", "maxItems", "maxLength", "maximum", "minItems",
  "minLength", "minimum", "oneOf", "pattern", "prefixItems", "properties", "required", "title",
  "type", "discriminator", "allOf", "examples", "format", "uniqueItems", "deprecated", "readOnly",
]);

function pascal(text) {
  return text
    .split(/[^A-Za-z0-9]+/)
    .filter(Boolean)
    .map((part) => part[0].toUpperCase() + part.slice(1))
    .join("");
}

function stable(value) {
  if (Array.isArray(value)) return `[${value.map(stable).join(",")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${stable(value[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(value);
}

const IDENT = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
const key = (name) => (IDENT.test(name) ? name : JSON.stringify(name));

function docLines(schema, extra = []) {
  const lines = [];
  if (typeof schema.description === "string") lines.push(...schema.description.split("\n"));
  for (const [word, label] of [
    ["minLength", "min length"],
    ["maxLength", "max length"],
    ["minimum", "minimum"],
    ["maximum", "maximum"],
    ["exclusiveMinimum", "exclusive minimum"],
    ["exclusiveMaximum", "exclusive maximum"],
    ["minItems", "min items"],
    ["maxItems", "max items"],
    ["pattern", "pattern"],
  ]) {
    if (schema[word] !== undefined) lines.push(`${label}: ${schema[word]}`);
  }
  if (schema.default !== undefined) lines.push(`default: ${JSON.stringify(schema.default)}`);
  lines.push(...extra);
  return lines;
}

function jsdoc(lines, indent) {
  if (lines.length === 0) return "";
  const safe = lines.map((line) => line.replaceAll("*/", "*\\/").trimEnd());
  if (safe.length === 1) return `${indent}/** ${safe[0]} */\n`;
  return `${indent}/**\n${safe.map((l) => `${indent} *${l ? " " + l : ""}`).join("\n")}\n${indent} */\n`;
}

class Generator {
  constructor(schema) {
    this.schema = schema;
    // name -> { schema, stable, origin }
    this.named = new Map();
    this.methods = [];
  }

  // Registers a named schema; returns the name it is exported under.
  register(name, schema, origin) {
    const body = stable(schema);
    const existing = this.named.get(name);
    if (existing === undefined) {
      this.named.set(name, { schema, stable: body, origin });
      return name;
    }
    if (existing.stable === body) return name;
    const alt = `${name}${pascal(origin)}`;
    if (this.named.has(alt) && this.named.get(alt).stable !== body) {
      throw new Error(`two schemas named ${name} (and ${alt}) differ`);
    }
    this.named.set(alt, { schema, stable: body, origin });
    return alt;
  }

  // A schema's `$defs`, each registered under its exported name; returns the rewriter that turns
  // `#/$defs/X` refs into refs to those names, and the names.
  registerDefs(schema, origin) {
    const defs = schema.$defs ?? {};
    const names = {};
    for (const defName of Object.keys(defs)) names[defName] = defName;
    const rewrite = (node) => {
      if (Array.isArray(node)) return node.map(rewrite);
      if (node === null || typeof node !== "object") return node;
      const out = {};
      for (const [k, v] of Object.entries(node)) {
        if (k === "$defs") continue;
        if (k === "$ref") {
          const m = /^#\/\$defs\/(.+)$/.exec(v);
          if (!m || !(m[1] in defs)) throw new Error(`${origin}: unresolvable $ref ${v}`);
          out.$ref = `#/named/${names[m[1]]}`;
        } else if (k === "properties") {
          out[k] = Object.fromEntries(Object.entries(v).map(([p, s]) => [p, rewrite(s)]));
        } else if (k === "discriminator") {
          // Its mapping names `$defs` refs; the union itself says the same with `oneOf`.
          out[k] = v;
        } else {
          out[k] = rewrite(v);
        }
      }
      return out;
    };
    // Definitions refer to each other: register under final names, then rewrite once more with
    // them (a name changes only on a conflict).
    for (const [defName, def] of Object.entries(defs)) {
      names[defName] = this.register(defName, rewrite(def), origin);
    }
    for (const [defName, def] of Object.entries(defs)) {
      const entry = this.named.get(names[defName]);
      entry.schema = rewrite(def);
      entry.stable = stable(entry.schema);
    }
    return { rewrite, names };
  }

  // A top-level schema of a method's params/result, with its own $defs.
  registerRoot(schema, fallbackName, origin) {
    const { rewrite } = this.registerDefs(schema, origin);
    const title = typeof schema.title === "string" && IDENT.test(schema.title) ? schema.title : fallbackName;
    return this.register(title, rewrite(schema), origin);
  }

  type(schema, indent) {
    if (schema === true || schema === undefined) return "unknown";
    if (schema === false) return "never";
    for (const word of Object.keys(schema)) {
      if (!HANDLED.has(word)) throw new Error(`unhandled JSON Schema keyword ${word}`);
    }
    if (schema.$ref !== undefined) {
      const m = /^#\/named\/(.+)$/.exec(schema.$ref);
      if (!m) throw new Error(`unresolved $ref ${schema.$ref}`);
      return m[1];
    }
    if (schema.allOf !== undefined) {
      return schema.allOf.map((s) => this.wrap(this.type(s, indent))).join(" & ");
    }
    const alternatives = schema.anyOf ?? schema.oneOf;
    if (alternatives !== undefined) {
      return this.union(alternatives.map((s) => this.type(s, indent)));
    }
    if (schema.const !== undefined) return JSON.stringify(schema.const);
    if (schema.enum !== undefined) return this.union(schema.enum.map((v) => JSON.stringify(v)));
    const types = Array.isArray(schema.type) ? schema.type : schema.type === undefined ? [] : [schema.type];
    if (types.length === 0) {
      if (schema.properties !== undefined) return this.object(schema, indent);
      return "unknown";
    }
    return this.union(types.map((t) => this.single(t, schema, indent)));
  }

  single(type, schema, indent) {
    switch (type) {
      case "string":
        return "string";
      case "integer":
      case "number":
        return "number";
      case "boolean":
        return "boolean";
      case "null":
        return "null";
      case "array":
        if (schema.prefixItems !== undefined) {
          const items = schema.prefixItems.map((s) => this.type(s, indent));
          return `[${items.join(", ")}]`;
        }
        return `${this.wrap(this.type(schema.items, indent))}[]`;
      case "object":
        return this.object(schema, indent);
      default:
        throw new Error(`unhandled JSON Schema type ${type}`);
    }
  }

  wrap(text) {
    return /[|&]/.test(text) && !/^[{[(]/.test(text) ? `(${text})` : text;
  }

  union(parts) {
    const unique = [...new Set(parts)];
    return unique.length === 1 ? unique[0] : unique.join(" | ");
  }

  object(schema, indent) {
    const props = schema.properties ?? {};
    const names = Object.keys(props);
    const extra = schema.additionalProperties;
    if (names.length === 0) {
      if (extra === false) return "Record<string, never>";
      if (extra === undefined || extra === true) return "Record<string, unknown>";
      return `Record<string, ${this.type(extra, indent)}>`;
    }
    return `{\n${this.members(schema, indent + "  ")}${indent}}`;
  }

  members(schema, indent) {
    const required = new Set(schema.required ?? []);
    let out = "";
    for (const [name, prop] of Object.entries(schema.properties ?? {})) {
      out += jsdoc(docLines(prop), indent);
      out += `${indent}${key(name)}${required.has(name) ? "" : "?"}: ${this.type(prop, indent)};\n`;
    }
    // Results allow unknown fields (the protocol is additive), but an index signature would hide
    // a misspelt field from the type checker: it is emitted only for schemas with no properties.
    return out;
  }

  declaration(name, schema) {
    const doc = jsdoc(docLines(schema), "");
    const isObject =
      schema.properties !== undefined && Object.keys(schema.properties).length > 0 &&
      (schema.type === "object" || schema.type === undefined) && schema.anyOf === undefined;
    if (isObject) return `${doc}export interface ${name} {\n${this.members(schema, "  ")}}\n`;
    return `${doc}export type ${name} = ${this.type(schema, "")};\n`;
  }

  // Event data: a JSON Schema per type when the schema has one, else the documented field names
  // (prose descriptions; `name?` marks a field that is not always present) typed `unknown`.
  eventData(typeName, data, origin) {
    const isSchema =
      data !== null && typeof data === "object" &&
      ("type" in data || "properties" in data || "$ref" in data || "anyOf" in data);
    if (isSchema) {
      return this.registerRoot(data, `${pascal(typeName)}EventData`, origin);
    }
    const properties = {};
    const required = [];
    for (const [field, prose] of Object.entries(data ?? {})) {
      const optional = field.endsWith("?");
      const bare = optional ? field.slice(0, -1) : field;
      properties[bare] = { description: String(prose) };
      if (!optional) required.push(bare);
    }
    return this.register(
      `${pascal(typeName)}EventData`,
      { type: "object", properties, required, additionalProperties: true },
      origin,
    );
  }

  generate() {
    const s = this.schema;
    for (const [method, spec] of Object.entries(s.methods ?? {})) {
      const base = pascal(method);
      const params = this.registerRoot(spec.params ?? { type: "object" }, `${base}Params`, method);
      const result = this.registerRoot(spec.result ?? { type: "object" }, `${base}Result`, method);
      this.methods.push({ method, params, result, summary: spec.summary, mutating: spec.mutating === true });
    }
    const notification = s.notifications?.event;
    let eventName = null;
    const eventTypes = [];
    if (notification !== undefined) {
      eventName = this.registerRoot(notification.params, "EventNotification", "event");
      // Since protocol 1.1 the schema types each event (`typed`: a union of `<Type>Event`
      // definitions; `types[type].data` names the data's definition). Before, `data` was prose.
      const typed = notification.typed !== undefined ? this.registerDefs(notification.typed, "event").names : {};
      for (const [typeName, spec] of Object.entries(notification.types ?? {})) {
        const dataName =
          typeof spec.data === "string" && spec.data in typed
            ? typed[spec.data]
            : this.eventData(typeName, spec.fields ?? spec.data, `event ${typeName}`);
        eventTypes.push({ typeName, dataName, summary: spec.summary });
      }
    }

    let out = "";
    out += "// Generated by scripts/gen-types.mjs from protocol/schema/xum-protocol.schema.json.\n";
    out += "// Do not edit: run `npm run gen` after `make schema`. A test fails when this file is stale.\n";
    out += "/* eslint-disable */\n\n";
    out += `/** The protocol version this file was generated from (\`major.minor\`). */\n`;
    out += `export const PROTOCOL_VERSION = ${JSON.stringify(s.protocol)};\n\n`;
    out += "/** Every error kind and its JSON-RPC code (`data.kind` on the wire). */\n";
    out += "export const ERROR_CODES = {\n";
    for (const [kind, code] of Object.entries(s.errors ?? {})) out += `  ${key(kind)}: ${code},\n`;
    out += "} as const;\n\n";
    out += "/** An error kind this client knows; the daemon may add others (fall back on the code). */\n";
    out += "export type ErrorKind = keyof typeof ERROR_CODES;\n\n";

    for (const name of [...this.named.keys()].sort()) {
      out += this.declaration(name, this.named.get(name).schema) + "\n";
    }

    out += "/** Every method: its params and its result. */\n";
    out += "export interface Methods {\n";
    for (const m of [...this.methods].sort((a, b) => a.method.localeCompare(b.method))) {
      out += jsdoc(m.summary ? [m.summary] : [], "  ");
      out += `  ${JSON.stringify(m.method)}: { params: ${m.params}; result: ${m.result} };\n`;
    }
    out += "}\n\n";
    out += "export type MethodName = keyof Methods;\n";
    out += "export type Params<M extends MethodName> = Methods[M][\"params\"];\n";
    out += "export type Result<M extends MethodName> = Methods[M][\"result\"];\n\n";
    out += "export const METHOD_NAMES: readonly MethodName[] = [\n";
    for (const m of [...this.methods].sort((a, b) => a.method.localeCompare(b.method))) {
      out += `  ${JSON.stringify(m.method)},\n`;
    }
    out += "];\n\n";
    out += "/** The methods that change what the daemon holds: their params take a `request_key`. */\n";
    out += "export const MUTATING_METHODS: readonly MethodName[] = [\n";
    for (const m of [...this.methods].sort((a, b) => a.method.localeCompare(b.method))) {
      if (m.mutating) out += `  ${JSON.stringify(m.method)},\n`;
    }
    out += "];\n\n";

    if (eventName !== null) {
      out += "/** Every event type and its `data`. */\n";
      out += "export interface EventDataMap {\n";
      for (const e of [...eventTypes].sort((a, b) => a.typeName.localeCompare(b.typeName))) {
        out += jsdoc(e.summary ? [e.summary] : [], "  ");
        out += `  ${JSON.stringify(e.typeName)}: ${e.dataName};\n`;
      }
      out += "}\n\n";
      out += "export type EventType = keyof EventDataMap;\n\n";
      out += "export const EVENT_TYPES: readonly EventType[] = [\n";
      for (const e of [...eventTypes].sort((a, b) => a.typeName.localeCompare(b.typeName))) {
        out += `  ${JSON.stringify(e.typeName)},\n`;
      }
      out += "];\n\n";
      out += "/** One event of a known type, its `data` typed. */\n";
      out += `export type TypedEvent<T extends EventType> = Omit<${eventName}, "type" | "data"> & {\n`;
      out += "  type: T;\n  data: EventDataMap[T];\n};\n\n";
      out += "/** Any known event: switch on `type` to narrow `data`. */\n";
      out += "export type XumEvent = { [T in EventType]: TypedEvent<T> }[EventType];\n";
      out += `/** The \`event\` notification's params as the schema states them (any type). */\n`;
      out += `export type RawEvent = ${eventName};\n`;
    }
    return out;
  }
}

export function generate(schema) {
  return new Generator(schema).generate();
}

function main(argv) {
  const check = argv[0] === "--check";
  const [schemaPath, outPath] = check ? argv.slice(1) : argv;
  if (!schemaPath || !outPath) {
    process.stderr.write("usage: gen-types.mjs [--check] SCHEMA OUT\n");
    return 2;
  }
  const text = generate(JSON.parse(readFileSync(schemaPath, "utf8")));
  if (check) {
    let current = null;
    try {
      current = readFileSync(outPath, "utf8");
    } catch {
      current = null;
    }
    if (current !== text) {
      process.stderr.write(`${outPath} is stale: run \`npm run gen\` in clients/ts (after \`make schema\`)\n`);
      return 1;
    }
    return 0;
  }
  writeFileSync(outPath, text);
  return 0;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  process.exitCode = main(process.argv.slice(2));
}
