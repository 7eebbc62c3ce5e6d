// Bundles the extension (with the client's sources) into dist/extension.js, CommonJS as VS Code
// loads it, and each test into out/test/*.test.mjs (ESM, run by `node --test`).
import { build } from "esbuild";
import { readdirSync } from "node:fs";

await build({
  entryPoints: ["src/extension.ts"],
  bundle: true,
  platform: "node",
  target: "node18",
  format: "cjs",
  external: ["vscode"],
  outfile: "dist/extension.js",
  sourcemap: true,
  logLevel: "warning",
});

const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts"));
await build({
  entryPoints: tests.map((f) => `test/${f}`),
  bundle: true,
  platform: "node",
  target: "node20",
  format: "esm",
  // Tests never import `vscode`; the daemon helper stays a module of its own per bundle.
  external: ["vscode"],
  outdir: "out/test",
  outExtension: { ".js": ".mjs" },
  sourcemap: true,
  logLevel: "warning",
});
