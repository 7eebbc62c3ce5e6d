"""`xum mcp`: the daemon's workspaces as an MCP server over stdio, a thin client of the daemon.

- `tools`: the tool table (name -> daemon method, params and result models, annotations) and
  how a result or an error becomes a tool result; no MCP SDK import.
- `resources`: the workspace list and each workspace's status as resources, and which of them
  a daemon event changes; no MCP SDK import.
- `server`: the SDK's wiring (the only module that imports it), the daemon connections and the
  event watcher that drives the change notifications.
"""
