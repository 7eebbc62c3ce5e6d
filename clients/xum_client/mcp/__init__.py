"""`xum mcp`: the daemon's workspaces as an MCP server over stdio, a thin client of the daemon.

- `tools`: the tool table (name -> daemon method, params and result models, annotations) and
  how a result or an error becomes a tool result; no MCP SDK import.
- `resources`: the workspace list and each workspace's status as resources, which of them a
  daemon event changes, and which of them the agent listens to; no MCP SDK import.
- `watch`: the event watcher, one connection following the daemon's events, which says what
  changed; no MCP SDK import.
- `server`: the SDK's wiring (the only module that imports it), the daemon connections, and the
  change notifications of both protocol eras, fed from the watcher through one publisher.
"""
