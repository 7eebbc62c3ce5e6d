-- What the plugin knows of the daemon, kept current by events: projects, workspaces, and
-- cleanup obligations (pending ones drive the statusline). `epoch`/`seq` say how far the
-- event stream was read, so a reconnect can resume after it.
local util = require('xum.util')

local M = {
  projects = {},
  workspaces = {},
  obligations = {},
  epoch = nil,
  seq = nil,
  loaded = false,
  -- bumped on every change; tests and callers can wait on it
  version = 0,
  -- functions called with each new event (after dedup), before the cache takes it
  listeners = {},
}

local notify_scheduled = false

local function changed()
  M.version = M.version + 1
  -- Deferred to the main loop (not every context may fire autocommands or redraw), and
  -- coalesced: a burst of events (a replay, a project removal) redraws once.
  if notify_scheduled then
    return
  end
  notify_scheduled = true
  vim.schedule(function()
    notify_scheduled = false
    pcall(vim.api.nvim_exec_autocmds, 'User', { pattern = 'XumChanged', modeline = false })
    pcall(vim.cmd, 'redrawstatus!')
  end)
end
M.changed = changed

-- The tables of `list` that have a string id, by id (what an answer may hold is not trusted).
local function index(list)
  local out = {}
  if type(list) ~= 'table' then
    return out
  end
  for _, item in ipairs(list) do
    if type(item) == 'table' and type(item.id) == 'string' then
      out[item.id] = item
    end
  end
  return out
end

M.index = index

function M.reset()
  M.projects, M.workspaces, M.obligations = {}, {}, {}
  M.epoch, M.seq, M.loaded = nil, nil, false
  changed()
end

-- Replace everything with an events.subscribe snapshot (a fresh start or a resync).
function M.apply_snapshot(epoch, seq, snapshot)
  snapshot = snapshot or {}
  M.projects = index(snapshot.projects)
  M.workspaces = index(snapshot.workspaces)
  M.obligations = {}
  M.epoch, M.seq, M.loaded = epoch, seq, true
  changed()
end

-- Merge obligations from cleanup.list: the newer record of each wins (an event may have
-- overtaken the list's answer).
function M.merge_obligations(list)
  if type(list) ~= 'table' then
    return
  end
  for _, ob in ipairs(list) do
    if type(ob) == 'table' and type(ob.id) == 'string' then
      local known = M.obligations[ob.id]
      if not known or (tonumber(ob.updated_at) or 0) >= (tonumber(known.updated_at) or 0) then
        M.obligations[ob.id] = ob
      end
    end
  end
  changed()
end

-- Apply one event; returns false for one already applied (a replay overlapping the stream).
function M.apply_event(ev)
  if type(ev) ~= 'table' then
    return false
  end
  local seq = tonumber(ev.seq)
  if seq and M.epoch == ev.epoch and M.seq and seq <= M.seq then
    return false
  end
  if ev.epoch ~= nil and ev.epoch ~= M.epoch then
    -- Another daemon run without a resubscribe: its numbers start over.
    M.epoch = ev.epoch
  end
  if seq then
    M.seq = seq
  end
  for _, listener in ipairs(M.listeners) do
    local ok, err = pcall(listener, ev)
    if not ok then
      vim.schedule(function()
        vim.notify('xum: event listener failed: ' .. tostring(err), vim.log.levels.ERROR)
      end)
    end
  end
  local data = type(ev.data) == 'table' and ev.data or {}
  local kind = ev.type or ''
  if kind == 'workspace.removed' then
    if type(data.workspace_id) == 'string' then
      M.workspaces[data.workspace_id] = nil
    end
  elseif kind:sub(1, 10) == 'workspace.' and type(data.workspace) == 'table' then
    if type(data.workspace.id) ~= 'string' then
      return false -- not a workspace this plugin can file
    end
    M.workspaces[data.workspace.id] = data.workspace
  elseif kind == 'project.removed' then
    local pid = data.project_id
    if type(pid) == 'string' then
      M.projects[pid] = nil
      for id, ws in pairs(M.workspaces) do
        if ws.project_id == pid then
          M.workspaces[id] = nil
        end
      end
    end
  elseif kind:sub(1, 8) == 'project.' and type(data.project) == 'table' then
    if type(data.project.id) ~= 'string' then
      return false
    end
    M.projects[data.project.id] = data.project
  elseif kind == 'cleanup.obligation_changed' and type(data.obligation) == 'table' then
    M.merge_obligations({ data.obligation })
    return true
  end
  changed()
  return true
end

-- Pending cleanup obligations, for one workspace or all.
function M.pending_cleanup(workspace_id)
  local n = 0
  for _, ob in pairs(M.obligations) do
    if ob.state == 'pending' and (workspace_id == nil or ob.workspace_id == workspace_id) then
      n = n + 1
    end
  end
  return n
end

function M.sorted_workspaces()
  local list = {}
  for _, ws in pairs(M.workspaces) do
    list[#list + 1] = ws
  end
  table.sort(list, function(a, b)
    local pa = (M.projects[a.project_id] or {}).name or a.project_id or ''
    local pb = (M.projects[b.project_id] or {}).name or b.project_id or ''
    if pa ~= pb then
      return pa < pb
    end
    return (a.name or '') < (b.name or '')
  end)
  return list
end

-- The workspace whose checkout holds `dir` (the deepest, should checkouts nest).
function M.workspace_at(dir)
  return util.deepest_holding(dir, M.workspaces)
end

-- The project a directory belongs to: its repository, or one of its workspaces.
function M.project_at(dir)
  local ws = M.workspace_at(dir)
  if ws then
    return M.projects[ws.project_id]
  end
  return util.deepest_holding(dir, M.projects)
end

return M
