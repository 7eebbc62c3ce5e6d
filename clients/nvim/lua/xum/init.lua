-- xum.nvim: workspaces of the xum daemon from Neovim. See :help xum.
local client = require('xum.client')
local state = require('xum.state')
local util = require('xum.util')

local M = {}

M.client = client
M.state = state

-- setup{ socket, root, host, connect_timeout_ms, timeout_ms, long_timeout_ms, events, reconnect,
--        reconnect_min_ms, reconnect_max_ms, statusline = { prefix } }
function M.setup(opts)
  opts = opts or {}
  local statusline_opts = opts.statusline
  local conf = vim.deepcopy(opts)
  conf.statusline = nil
  -- a misspelt option is said, not silently ignored
  for key in pairs(conf) do
    if client.config[key] == nil and key ~= 'socket' and key ~= 'root' and key ~= 'host' then
      vim.notify('xum: unknown setup option ' .. tostring(key) .. ' (see :help xum.setup())', vim.log.levels.WARN)
      conf[key] = nil
    end
  end
  local before = client.socket_path()
  client.config = vim.tbl_extend('force', client.config, conf)
  if type(statusline_opts) == 'table' then
    M.statusline_config = vim.tbl_extend('force', M.statusline_config, statusline_opts)
  end
  -- A new socket means another daemon: forget the old one's connection and state.
  if client.socket_path() ~= before and client.status ~= 'idle' then
    client.stop()
    state.reset()
  end
  return M
end

M.statusline_config = { prefix = 'xum:' }

-- Connect now (otherwise the first command or statusline draw does).
function M.connect(cb)
  client.ensure(cb or function(err)
    if err then
      vim.notify(util.format_error(err), vim.log.levels.WARN)
    end
  end)
end

-- Call any method: cb(err, result). Errors are tables {code, message, data = {kind, ...}}.
function M.call(method, params, cb, timeout_ms)
  client.request(method, params, cb, timeout_ms)
end

function M.call_sync(method, params, timeout_ms)
  return client.request_sync(method, params, timeout_ms)
end

local function cwd()
  local dir = vim.fn.getcwd()
  return util.uv.fs_realpath(dir) or dir
end
M.cwd = cwd

-- The workspace the current window's directory is in, from what the events told us.
function M.current_workspace()
  return state.workspace_at(cwd())
end

-- For 'statusline' / 'winbar' / lualine: "xum:<name>", its state unless active, "!" when
-- interrupted, and "cleanup:<n>" while cleanup obligations are pending. Never blocks: it
-- reads the cache, and starts connecting in the background the first time.
function M.statusline()
  if client.status == 'idle' then
    client.ensure(function() end)
    return ''
  end
  local parts = {}
  local ws = M.current_workspace()
  if ws then
    local text = M.statusline_config.prefix .. tostring(ws.name)
    if ws.state ~= 'active' then
      text = text .. ' ' .. tostring(ws.state)
    end
    if ws.interrupted then
      text = text .. '!'
    end
    parts[#parts + 1] = text
  end
  local pending = state.pending_cleanup()
  if pending > 0 then
    parts[#parts + 1] = 'cleanup:' .. pending
  end
  if client.status == 'offline' and state.loaded then
    parts[#parts + 1] = '(xumd offline)'
  end
  return table.concat(parts, ' ')
end

return M
