-- Small helpers shared by the plugin's modules.
local M = {}

M.uv = vim.uv or vim.loop

-- JSON null decodes to the sentinel vim.NIL, which is truthy in Lua: a check like
-- `if ws.last_cleanup then` would take a null for a value. Every answer goes through
-- denull, which drops null-valued object fields (absent and null mean the same in the
-- protocol) and leaves nulls inside arrays as vim.NIL (removing them would shift the
-- indices); readers of arrays check each item's type.
function M.denull(value)
  if type(value) ~= 'table' then
    if value == vim.NIL then
      return nil
    end
    return value
  end
  local is_array = (vim.islist or vim.tbl_islist)(value)
  for key, item in pairs(value) do
    if item == vim.NIL then
      if not is_array then
        value[key] = nil
      end
    elseif type(item) == 'table' then
      M.denull(item)
    end
  end
  return value
end

-- The value, or nil when it is absent or a JSON null.
function M.nn(value)
  if value == vim.NIL then
    return nil
  end
  return value
end

-- Application error codes (docs/PROTOCOL.md); used when an error carries no data.kind.
local KINDS = {
  [-32700] = 'parse_error',
  [-32600] = 'invalid_request',
  [-32601] = 'method_not_found',
  [-32602] = 'invalid_params',
  [-32603] = 'internal',
  [-32001] = 'not_found',
  [-32002] = 'busy',
  [-32003] = 'conflict',
  [-32004] = 'invalid_name',
  [-32005] = 'invalid_scope',
  [-32006] = 'not_safe',
  [-32007] = 'cleanup_pending',
  [-32008] = 'shutting_down',
  [-32009] = 'protocol_mismatch',
  [-32010] = 'timeout',
  [-32011] = 'frame_too_large',
  [-32012] = 'invalid_state',
  [-32013] = 'untrusted',
  [-32014] = 'operation_failed',
  [-32015] = 'invalid_path',
  [-32016] = 'permission_denied',
  [-32017] = 'disk_full',
}

-- The machine-readable kind of an error object: data.kind, else by code, else 'error'.
function M.kind(err)
  if type(err) ~= 'table' then
    return 'error'
  end
  local data = M.nn(err.data)
  if type(data) == 'table' and type(M.nn(data.kind)) == 'string' then
    return data.kind
  end
  return KINDS[M.nn(err.code)] or 'error'
end

-- Text from the daemon that names things others chose (a process names itself; a label
-- or message quotes it) with control characters shown as \ddd: an escape sequence or a
-- newline never reaches the screen as such.
function M.printable(text)
  return (tostring(text):gsub('%c', function(c)
    return string.format('\\%03d', c:byte())
  end))
end

-- One line per holder: kind, process id, label, and how to free it.
function M.holder_lines(holders)
  local lines = {}
  if type(holders) ~= 'table' then
    return lines
  end
  for _, h in ipairs(holders) do
    if type(h) == 'table' then
      local pid = M.nn(h.pid)
      local line = '  held by ' .. M.printable(M.nn(h.kind) or 'process')
      if pid then
        line = line .. ' pid ' .. tostring(pid)
      end
      local label = M.nn(h.label)
      if label and label ~= '' then
        line = line .. ': ' .. M.printable(label)
      end
      local command = M.nn(h.command)
      if command and command ~= '' then
        line = line .. ' `' .. M.printable(command) .. '`'
      end
      local ws = M.nn(h.workspace)
      if ws then
        line = line .. ' (workspace ' .. M.printable(ws) .. ')'
      end
      -- a process the daemon started: the CLI stops it
      local process_id = M.nn(h.process_id)
      if process_id then
        line = line .. ' (free it: xum kill ' .. M.printable(process_id) .. ')'
      end
      lines[#lines + 1] = line
    end
  end
  return lines
end

-- The text shown for an error answer: "xum: <kind>: <message>" and one line per holder.
function M.format_error(err, what)
  if type(err) ~= 'table' then
    return 'xum: ' .. (what and (what .. ': ') or '') .. tostring(err)
  end
  local kind = M.kind(err)
  local message = M.printable(M.nn(err.message) or '')
  local prefix = 'xum: ' .. kind .. ': '
  if what then
    prefix = 'xum: ' .. what .. ': ' .. kind .. ': '
  end
  -- The daemon's message may already start with the kind ("busy: ..."): say it once.
  if message:sub(1, #kind + 2) == kind .. ': ' then
    message = message:sub(#kind + 3)
  end
  local lines = { prefix .. message }
  local data = M.nn(err.data)
  if type(data) == 'table' then
    vim.list_extend(lines, M.holder_lines(M.nn(data.holders)))
    if kind == 'busy' and #lines > 1 then
      lines[#lines + 1] = '  free it (stop or close these), or archive with --stop for the daemon\'s own processes'
    end
  end
  return table.concat(lines, '\n')
end

-- Is `path` the directory `root` or inside it (both absolute, no trailing slash)?
function M.is_within(path, root)
  if type(path) ~= 'string' or type(root) ~= 'string' or root == '' then
    return false
  end
  if path == root then
    return true
  end
  local prefix = root:sub(-1) == '/' and root or (root .. '/')
  return path:sub(1, #prefix) == prefix
end

-- The deepest of `items` (workspaces or projects, each with a path) that holds `dir`
-- (checkouts may nest).
function M.deepest_holding(dir, items)
  local best
  for _, item in pairs(items) do
    if M.is_within(dir, item.path) and (not best or #item.path > #best.path) then
      best = item
    end
  end
  return best
end

return M
