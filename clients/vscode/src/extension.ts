// The VS Code side: a tree of projects and workspaces, commands, a status bar item. The logic is
// in ./logic (no `vscode` import there); this file only adapts it to the editor.

import * as vscode from "vscode";

import { XumClient, type ProjectInfo, type WorkspaceInfo } from "../../ts/src/index.js";
import { Commands, type PickItem, type Ui } from "./logic/commands.js";
import { formatError, projectLabel, statusBarText, workspaceLabel, type WorkspaceLabel } from "./logic/format.js";
import { WorkspaceModel } from "./logic/model.js";
import { clientOptions } from "./logic/settings.js";
import { ModelSync } from "./logic/sync.js";

type Node = { kind: "project"; project: ProjectInfo } | { kind: "workspace"; workspace: WorkspaceInfo };

class Tree implements vscode.TreeDataProvider<Node> {
  private readonly changed = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.changed.event;

  constructor(private readonly model: WorkspaceModel) {}

  refresh(): void {
    this.changed.fire(undefined);
  }

  getChildren(node?: Node): Node[] {
    if (node === undefined) return this.model.projectList().map((project) => ({ kind: "project", project }));
    if (node.kind === "project") {
      return this.model.workspacesOf(node.project.id).map((workspace) => ({ kind: "workspace", workspace }));
    }
    return [];
  }

  getTreeItem(node: Node): vscode.TreeItem {
    if (node.kind === "project") {
      const label = projectLabel(node.project, this.model.workspacesOf(node.project.id));
      return treeItem(label, node.project.id, vscode.TreeItemCollapsibleState.Expanded);
    }
    return treeItem(workspaceLabel(node.workspace), node.workspace.id, vscode.TreeItemCollapsibleState.None);
  }
}

function treeItem(label: WorkspaceLabel, id: string, collapsible: vscode.TreeItemCollapsibleState): vscode.TreeItem {
  const item = new vscode.TreeItem(label.label, collapsible);
  item.description = label.description;
  item.tooltip = label.tooltip;
  item.contextValue = label.contextValue;
  item.iconPath = new vscode.ThemeIcon(label.icon);
  item.id = id;
  return item;
}

const ui: Ui = {
  async pick<T>(items: PickItem<T>[], placeholder: string): Promise<T | undefined> {
    const chosen = await vscode.window.showQuickPick(
      items.map((i) => ({ label: i.label, description: i.description, value: i.value })),
      { placeHolder: placeholder },
    );
    return chosen?.value;
  },
  async input(prompt, validate) {
    return vscode.window.showInputBox({ prompt, validateInput: (v) => validate(v) ?? undefined });
  },
  async confirm(message, action) {
    return (await vscode.window.showWarningMessage(message, { modal: true }, action)) === action;
  },
  info(message) {
    void vscode.window.showInformationMessage(message);
  },
  error(message) {
    void vscode.window.showErrorMessage(message);
  },
  async openFolder(path, newWindow, authority) {
    const uri = authority === undefined ? vscode.Uri.file(path) : vscode.Uri.from({ scheme: "vscode-remote", authority, path });
    await vscode.commands.executeCommand("vscode.openFolder", uri, { forceNewWindow: newWindow });
  },
  openTerminal(name, place) {
    const options: vscode.TerminalOptions =
      "cwd" in place ? { name, cwd: place.cwd } : { name, shellPath: place.argv[0], shellArgs: place.argv.slice(1) };
    vscode.window.createTerminal(options).show();
  },
};

/** The commands the manifest declares, each showing `message`: the settings name no usable daemon. */
function activateBroken(context: vscode.ExtensionContext, message: string, commandNames: string[]): void {
  const status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 10);
  status.text = "$(error) xum";
  status.tooltip = message;
  status.show();
  context.subscriptions.push(status);
  for (const name of commandNames) {
    context.subscriptions.push(vscode.commands.registerCommand(name, () => void vscode.window.showErrorMessage(message)));
  }
  void vscode.window.showErrorMessage(message);
}

const COMMANDS = [
  "xum.refresh",
  "xum.newWorkspace",
  "xum.archive",
  "xum.unarchive",
  "xum.remove",
  "xum.openInNewWindow",
  "xum.openTerminal",
];

export function activate(context: vscode.ExtensionContext): void {
  const config = vscode.workspace.getConfiguration("xum");
  let client: XumClient;
  try {
    client = new XumClient(clientOptions({ socketPath: config.get<string>("socketPath"), host: config.get<string>("host") }));
  } catch (err) {
    // A host the hosts file does not name (or cannot be read): said at once, and by every command.
    activateBroken(context, formatError(err), COMMANDS);
    return;
  }
  const model = new WorkspaceModel();
  const tree = new Tree(model);
  const commands = new Commands(client, ui);
  const status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 10);
  status.command = "xum.workspaces.focus";
  status.show();

  const folder = (): string | null => vscode.workspace.workspaceFolders?.[0]?.uri.fsPath ?? null;
  let lastFailure: Error | null = null;
  const update = (): void => {
    tree.refresh();
    const text = statusBarText(client.connected, model.workspaceAt(folder()), model.pendingCleanups(), {
      host: client.host?.name ?? null,
      failure: lastFailure,
    });
    status.text = text.text;
    status.tooltip = text.tooltip;
  };

  const sync = new ModelSync(client, model, update);
  let subscribed = false;
  client.on("connect", () => {
    lastFailure = null;
    update();
    if (subscribed) return; // the client resumes its subscription by itself
    subscribed = true;
    sync.subscribe().catch((err: unknown) => {
      subscribed = false;
      void vscode.window.showErrorMessage(formatError(err));
    });
  });
  client.on("disconnect", update);
  client.on("connect_failed", (err) => {
    lastFailure = err;
    update();
  });
  client.start();

  // A command from the palette has no tree node: ask which workspace.
  const pickWorkspace = async (node: Node | undefined, states: WorkspaceInfo["state"][]): Promise<WorkspaceInfo | undefined> => {
    if (node?.kind === "workspace") return node.workspace;
    const candidates = [...model.workspaces.values()].filter((w) => states.includes(w.state));
    return ui.pick(
      candidates.map((w) => ({ label: w.name, description: `${model.projects.get(w.project_id)?.name ?? ""} · ${w.state}`, value: w })),
      "Workspace",
    );
  };
  const register = (name: string, fn: (node?: Node) => Promise<unknown>): void => {
    context.subscriptions.push(vscode.commands.registerCommand(name, fn));
  };
  register("xum.refresh", async () => {
    const all = await commands.listAll();
    if (all === undefined) return;
    model.reset(all);
    update();
  });
  register("xum.newWorkspace", (node) => commands.newWorkspace(node?.kind === "project" ? node.project.id : undefined));
  register("xum.archive", async (node) => {
    const ws = await pickWorkspace(node, ["active"]);
    if (ws) await commands.archive(ws);
  });
  register("xum.unarchive", async (node) => {
    const ws = await pickWorkspace(node, ["archived"]);
    if (ws) await commands.unarchive(ws);
  });
  register("xum.remove", async (node) => {
    const ws = await pickWorkspace(node, ["active", "archived"]);
    if (ws) await commands.remove(ws);
  });
  register("xum.openInNewWindow", async (node) => {
    const ws = await pickWorkspace(node, ["active"]);
    if (ws) await commands.openInNewWindow(ws);
  });
  register("xum.openTerminal", async (node) => {
    const ws = await pickWorkspace(node, ["active"]);
    if (ws) await commands.openTerminal(ws);
  });

  context.subscriptions.push(
    vscode.window.registerTreeDataProvider("xum.workspaces", tree),
    status,
    { dispose: () => void client.close() },
  );
  update();
}

export function deactivate(): void {
  // The client is closed through context.subscriptions.
}
