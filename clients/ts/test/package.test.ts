// The package as another project gets it: `npm pack` from the sources alone (what a clean clone
// holds: no dist/), the tarball installed offline into a scratch project (so it can have no
// runtime dependencies), then imported there by a script and by TypeScript, against a real daemon.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { shortTmpdir, withDaemon } from "./support/daemon.js";
import { runScript } from "./support/script.js";

/** clients/ts, from dist/test. */
const PACKAGE = fileURLToPath(new URL("../..", import.meta.url));
/** What the package's build needs besides its dependencies: a clean clone's files. */
const SOURCES = ["package.json", "package-lock.json", "tsconfig.json", "tsconfig.build.json", "README.md", "src"];

/** npm in `cwd`, free of the settings the `npm test` running this suite passes down. */
function npm(args: string[], cwd: string, cache: string): string {
  const env: Record<string, string> = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (value !== undefined && !key.toLowerCase().startsWith("npm_")) env[key] = value;
  }
  env["npm_config_cache"] = cache;
  env["npm_config_update_notifier"] = "false";
  return execFileSync("npm", args, { cwd, env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

test("npm pack from a clean clone's files gives a tarball that installs offline and imports", async () => {
  await withDaemon(async (daemon, tmp) => {
    const source = join(tmp, "pkg");
    mkdirSync(source);
    for (const name of SOURCES) cpSync(join(PACKAGE, name), join(source, name), { recursive: true });
    // The build's own tools (typescript), as `npm ci` would put them there.
    symlinkSync(join(PACKAGE, "node_modules"), join(source, "node_modules"));
    const cache = join(tmp, "npm-cache");
    const out = join(tmp, "out");
    mkdirSync(out);

    const packed = JSON.parse(npm(["pack", "--json", "--pack-destination", out], source, cache)) as {
      filename: string;
      files: { path: string }[];
    }[];
    const [tarball] = packed;
    assert.ok(tarball !== undefined);
    const files = tarball.files.map((f) => f.path).sort();
    for (const needed of ["dist/src/index.js", "dist/src/index.d.ts", "dist/src/generated/protocol.js", "README.md"]) {
      assert.ok(files.includes(needed), `${needed} is not in the tarball: ${files.join(", ")}`);
    }
    const stray = files.filter((f) => !f.startsWith("dist/src/") && !["package.json", "README.md"].includes(f));
    assert.deepEqual(stray, [], "only the built sources, the manifest and the README are shipped");

    const app = join(tmp, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true, type: "module" }));
    // Offline, with an empty cache: anything the package depended on could not be fetched.
    npm(["install", "--offline", "--no-audit", "--no-fund", join(out, tarball.filename)], app, cache);
    const manifest = JSON.parse(readFileSync(join(app, "node_modules", "@xum", "client", "package.json"), "utf8")) as {
      dependencies?: Record<string, string>;
    };
    assert.deepEqual(manifest.dependencies ?? {}, {}, "no runtime dependencies");

    // A script of that project, by the package's name, against a real daemon.
    const run = await runScript(
      `import { XumClient, CLIENT_VERSION } from "@xum/client";\n` +
        `const client = await XumClient.connect({ socketPath: process.argv[2] });\n` +
        `const status = await client.call("daemon.status");\n` +
        `console.log(JSON.stringify({ pid: status.pid, version: CLIENT_VERSION }));\n` +
        `await client.close();\n`,
      { dir: app, args: [daemon.socketPath] },
    );
    assert.ok(run.exited, `the script was still running at its deadline: ${run.stdout}${run.stderr}`);
    assert.equal(run.code, 0, run.stderr);
    assert.equal((JSON.parse(run.stdout) as { pid: number }).pid, daemon.pid);

    // And TypeScript finds the package's types: a typed call, a typed error.
    writeFileSync(
      join(app, "main.ts"),
      `import { XumClient, DaemonNotRunning, isRpcError, type Result } from "@xum/client";\n` +
        `const client: XumClient = await XumClient.connect({ root: "/nowhere" });\n` +
        `const status: Result<"daemon.status"> = await client.call("daemon.status");\n` +
        `const pid: number = status.pid;\n` +
        `export const seen = [pid, isRpcError(new Error("x"), "busy"), DaemonNotRunning.name];\n`,
    );
    const tsc = join(PACKAGE, "node_modules", "typescript", "bin", "tsc");
    const types = join(PACKAGE, "node_modules", "@types");
    const args = ["--noEmit", "--strict", "--target", "ES2022", "--module", "NodeNext", "--moduleResolution", "NodeNext"];
    execFileSync(process.execPath, [tsc, ...args, "--typeRoots", types, "--types", "node", "main.ts"], {
      cwd: app,
      encoding: "utf8",
    });
  });
});
