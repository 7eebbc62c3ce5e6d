// The VS Code extension inside a real VS Code: a real xumd on a temp root with a project made from a
// real git repository, code-server (Node 24) with the built .vsix installed and `xum.socketPath`
// in its user settings, and headless Chromium driven by playwright-core. It checks that the view
// lists the daemon's workspaces, that "xum: New Workspace" from the command palette creates one and
// the tree's "Archive Workspace" archives it (both seen by the daemon), and that the tree follows
// a change made outside the editor. Run by tests/editors/run.sh (`make test-editors`), which
// passes XUMD, VSIX and CHROMIUM. Every wait has a deadline inside one total budget
// (EDITORS_BUDGET_S); on a failure it prints the logs and leaves a screenshot in the temp dir.

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, writeFileSync, existsSync, rmSync } from "node:fs";
import { createConnection } from "node:net";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const need = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (tests/editors/run.sh sets it)`);
  return v;
};
const XUMD = need("XUMD");
const VSIX = need("VSIX");
const CHROMIUM = need("CHROMIUM");
const BUDGET_S = Number(process.env.EDITORS_BUDGET_S || "240");
const started = Date.now();
const deadline = started + BUDGET_S * 1000;
const left = () => deadline - Date.now();
const elapsed = () => `${((Date.now() - started) / 1000).toFixed(1)}s`;
const step = (msg) => console.log(`[${elapsed()}] ${msg}`);

// A hard stop: whatever hangs, the run ends at the budget (the cleanup below still runs).
const stopTimer = setTimeout(() => {
  console.error(`editors: the budget of ${BUDGET_S}s ran out`);
  cleanup().finally(() => process.exit(1));
}, BUDGET_S * 1000 + 5000);
stopTimer.unref();

/** Poll `fn` until it returns a truthy value, at most `ms` (and never past the total budget). */
async function until(what, fn, ms = 30000, every = 200) {
  const end = Math.min(Date.now() + ms, deadline);
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() >= end) {
      throw new Error(`timed out after ${(ms / 1000).toFixed(0)}s waiting for ${what}${last ? `: ${last.message}` : ""}`);
    }
    await new Promise((r) => setTimeout(r, every));
  }
}

const base = mkdtempSync("/tmp/xed-");
const root = join(base, "r");
const home = join(base, "home");
const repo = join(home, "demo");
const dataDir = join(base, "data");
const extDir = join(base, "ext");
const sock = join(root, "xumd.sock");
const procs = []; // {name, child, text}
let browser;

function startProc(name, cmd, args, env) {
  const child = spawn(cmd, args, {
    env,
    detached: true, // its own process group: the cleanup stops code-server's children too
    stdio: ["ignore", "pipe", "pipe"],
  });
  let text = ""; // the output's last 64 KiB, printed on a failure
  const add = (chunk) => {
    text = (text + chunk.toString()).slice(-65536);
  };
  child.stdout.on("data", add);
  child.stderr.on("data", add);
  child.exited = new Promise((r) => child.on("exit", (code, sig) => r({ code, sig })));
  procs.push({ name, child, text: () => text });
  return { child, text: () => text };
}

async function cleanup() {
  if (browser) await browser.close().catch(() => {});
  browser = undefined;
  for (const { child } of procs.reverse()) {
    if (child.exitCode !== null || child.signalCode !== null) continue;
    try {
      process.kill(-child.pid, "SIGTERM");
    } catch {}
    const gone = await Promise.race([child.exited.then(() => true), new Promise((r) => setTimeout(() => r(false), 5000))]);
    if (!gone) {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
      await Promise.race([child.exited, new Promise((r) => setTimeout(r, 2000))]);
    }
  }
  procs.length = 0;
}

/** One JSON-RPC call on the daemon's socket (NDJSON, a connection of its own). */
function rpc(method, params = {}) {
  return new Promise((resolve, reject) => {
    const s = createConnection({ path: sock });
    let buf = "";
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`${method}: no answer in 10s`));
    }, 10000);
    s.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    s.on("connect", () => s.write(JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }) + "\n"));
    s.on("data", (chunk) => {
      buf += chunk.toString();
      const nl = buf.indexOf("\n");
      if (nl < 0) return;
      clearTimeout(timer);
      s.destroy();
      const msg = JSON.parse(buf.slice(0, nl));
      if (msg.error) reject(new Error(`${method}: ${msg.error.message}`));
      else resolve(msg.result);
    });
  });
}

const workspaces = async () => (await rpc("workspace.list")).workspaces;
const wsNamed = async (name) => (await workspaces()).find((w) => w.name === name);

async function main() {
  mkdirSync(root, { recursive: true });
  mkdirSync(repo, { recursive: true });
  mkdirSync(join(base, "tmp"));
  const env = {
    ...process.env,
    TMPDIR: join(base, "tmp"), // code-server's and its git extension's sockets, removed with the rest
    HOME: home,
    XDG_CONFIG_HOME: join(home, ".config"),
    XDG_DATA_HOME: join(home, ".local", "share"),
    XDG_STATE_HOME: join(home, ".local", "state"),
    XDG_CACHE_HOME: join(home, ".cache"),
    GIT_AUTHOR_NAME: "xum test",
    GIT_AUTHOR_EMAIL: "test@xum.invalid",
    GIT_COMMITTER_NAME: "xum test",
    GIT_COMMITTER_EMAIL: "test@xum.invalid",
  };
  delete env.XUM_SOCKET;
  delete env.XUM_ROOT;
  delete env.XUM_HOST;
  delete env.NOTIFY_SOCKET;

  // A real repository with one commit.
  const git = (...args) => execFileSync("git", args, { cwd: repo, env, stdio: "pipe" });
  git("init", "-q", "-b", "main");
  writeFileSync(join(repo, "README.md"), "demo\n");
  git("add", "README.md");
  git("commit", "-q", "-m", "first");

  step(`xumd on ${root}`);
  const daemon = startProc("xumd", XUMD, ["--root", root, "--log-level", "debug"], env);
  await until("xumd to answer on its socket", async () => {
    if (daemon.child.exitCode !== null) throw new Error(`xumd exited: ${daemon.text().slice(-2000)}`);
    return existsSync(sock) && (await rpc("daemon.status"));
  });
  const { project } = await rpc("project.add", { path: repo, name: "demo" });
  const first = (await rpc("workspace.create", { project_id: project.id, name: "first" })).workspace;
  step(`project ${project.id}, workspace first (${first.state})`);

  // code-server: the .vsix installed, the socket in the user settings.
  const entry = join(here, "node_modules", "code-server", "out", "node", "entry.js");
  const csArgs = [
    entry,
    "--config", join(base, "code-server.yaml"),
    "--user-data-dir", dataDir,
    "--extensions-dir", extDir,
  ];
  step("installing the .vsix into code-server");
  execFileSync(process.execPath, [...csArgs, "--install-extension", VSIX], {
    env,
    stdio: "pipe",
    timeout: Math.min(120000, left()),
  });
  const installed = execFileSync(process.execPath, [...csArgs, "--list-extensions", "--show-versions"], {
    env,
    timeout: Math.min(60000, left()),
  }).toString();
  if (!/^xum\.xum-vscode@/m.test(installed)) throw new Error(`the extension is not listed as installed:\n${installed}`);
  step(`installed: ${installed.trim()}`);
  mkdirSync(join(dataDir, "User"), { recursive: true });
  writeFileSync(
    join(dataDir, "User", "settings.json"),
    JSON.stringify(
      {
        "xum.socketPath": sock,
        "workbench.startupEditor": "none",
        "workbench.tips.enabled": false,
        "security.workspace.trust.enabled": false,
        "extensions.autoCheckUpdates": false,
        "extensions.autoUpdate": false,
        "update.mode": "none",
        "telemetry.telemetryLevel": "off",
        "chat.disableAIFeatures": true,
      },
      null,
      2,
    ),
  );

  step("starting code-server");
  const cs = startProc(
    "code-server",
    process.execPath,
    [
      ...csArgs,
      "--bind-addr", "127.0.0.1:0",
      "--auth", "none",
      "--disable-telemetry",
      "--disable-update-check",
      "--disable-workspace-trust",
      "--disable-getting-started-override",
      "--ignore-last-opened",
    ],
    env,
  );
  const url = await until(
    "code-server to listen",
    () => {
      if (cs.child.exitCode !== null) throw new Error(`code-server exited: ${cs.text().slice(-2000)}`);
      const m = /HTTP server listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(cs.text());
      return m?.[1];
    },
    60000,
  );
  step(`code-server at ${url}`);

  step(`launching ${CHROMIUM}`);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: Math.min(60000, left()),
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.setDefaultTimeout(30000);
  const consoleLines = [];
  page.on("console", (m) => consoleLines.push(`${m.type()}: ${m.text()}`));
  try {
    await page.goto(`${url}/?folder=${encodeURIComponent(repo)}`, { timeout: Math.min(60000, left()) });
    await page.locator(".monaco-workbench").waitFor({ timeout: Math.min(90000, left()) });
    step("workbench loaded");

    // The view: the xum container in the activity bar, a project row and its workspace.
    const xumIcon = page.locator('.activitybar .action-item a[aria-label^="xum"], .activitybar .action-item[aria-label^="xum"]').first();
    await xumIcon.waitFor({ timeout: Math.min(90000, left()) });
    await xumIcon.click();
    const view = page.locator('.pane:has(.pane-header[aria-label*="Workspaces"]), [id="workbench.view.extension.xum"]').first();
    const row = (name) => view.locator(".monaco-list-row", { hasText: name }).first();
    await row("demo").waitFor({ timeout: Math.min(60000, left()) });
    await row("first").waitFor({ timeout: Math.min(30000, left()) });
    step(`the view lists the daemon's workspace: ${await row("first").innerText()}`);

    // A command creates one: the palette's "xum: New Workspace", the project picked, a name typed.
    await page.keyboard.press("F1");
    const quick = page.locator(".quick-input-widget");
    const quickInput = quick.locator("input").first();
    await quickInput.waitFor();
    await quickInput.fill(">xum: New Workspace");
    await quick.locator(".monaco-list-row", { hasText: "New Workspace" }).first().waitFor();
    await page.keyboard.press("Enter");
    await quick.locator(".monaco-list-row", { hasText: "demo" }).first().waitFor();
    await quickInput.fill("demo");
    await page.keyboard.press("Enter");
    await until("the name input box", async () => /name of the new workspace/i.test(await quick.innerText()), 20000);
    await quickInput.fill("second");
    await page.keyboard.press("Enter");
    const second = await until("the daemon to have workspace 'second' active", async () => {
      const w = await wsNamed("second");
      return w?.state === "active" && w;
    });
    await until("the tree to show 'second' active", async () => /active/.test(await row("second").innerText()));
    step(`created from the palette: ${second.id}; the tree shows: ${await row("second").innerText()}`);

    // And archives it: the tree's context menu on that row.
    await row("second").click({ button: "right" });
    // The menu's item by the keyboard: hovered (which focuses it), then Enter. A click right after
    // the menu opens can be taken for the end of the right click and ignored.
    const item = page.locator(".context-view .action-item", { hasText: "Archive Workspace" }).first();
    await item.waitFor();
    await item.hover();
    await until("the menu's 'Archive Workspace' to have the focus", () =>
      item.evaluate((el) => el.classList.contains("focused") || el.contains(document.activeElement)),
    10000);
    await page.keyboard.press("Enter");
    await until("the daemon to have 'second' archived", async () => (await wsNamed("second"))?.state === "archived");
    await until("the tree to show 'second' archived", async () => /archived/.test(await row("second").innerText()));
    step(`archived from the tree's menu; the tree shows: ${await row("second").innerText()}`);

    // The tree follows the daemon: a workspace created and one archived outside the editor.
    await rpc("workspace.create", { project_id: project.id, name: "third" });
    await rpc("workspace.archive", { workspace_id: first.id });
    await row("third").waitFor({ timeout: Math.min(30000, left()) });
    await until("the tree to show 'first' archived", async () => /archived/.test(await row("first").innerText()));
    step(`the tree follows outside changes: ${await row("third").innerText()} | ${await row("first").innerText()}`);
  } catch (err) {
    const shot = join(base, "failure.png");
    await page.screenshot({ path: shot }).catch(() => {});
    console.error(`screenshot: ${shot}`);
    console.error(`browser console (last 40):\n${consoleLines.slice(-40).join("\n")}`);
    throw err;
  }
}

let failed = false;
try {
  await main();
  step("editors: ok");
} catch (err) {
  failed = true;
  console.error(`editors: FAILED: ${err.stack || err}`);
  for (const { name, text } of procs) console.error(`--- ${name} log (tail) ---\n${text().slice(-4000)}`);
}
await cleanup();
clearTimeout(stopTimer);
if (!failed && !process.env.EDITORS_KEEP) rmSync(base, { recursive: true, force: true });
else console.error(`kept: ${base}`);
process.exit(failed ? 1 : 0);
