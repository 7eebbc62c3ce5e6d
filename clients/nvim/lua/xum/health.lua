-- :checkhealth xum — Neovim, the socket, the daemon's hello and protocol.
local M = {}

-- vim.health.start/ok/... (0.9+), vim.health.report_* (0.8), or the `health` module (0.7).
local function reporter()
  local h = vim.health
  if h and h.start then
    return h.start, h.ok, h.warn, h.error, h.info
  end
  if not (h and h.report_start) then
    h = require('health')
  end
  return h.report_start, h.report_ok, h.report_warn, h.report_error, h.report_info
end

function M.check()
  local start, ok, warn, fail, info = reporter()
  local client = require('xum.client')
  local util = require('xum.util')

  start('xum: Neovim')
  local v = vim.version()
  local version = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.7') == 1 then
    ok('Neovim ' .. version .. ' (0.7 or later)')
  else
    fail('Neovim ' .. version .. ': xum.nvim needs 0.7 or later')
  end
  if vim.uv then
    ok('vim.uv is available')
  else
    info('vim.loop is used (vim.uv arrived in Neovim 0.10)')
  end

  start('xum: daemon socket')
  local path, source = client.socket_path()
  info('socket: ' .. path .. ' (from ' .. source .. ')')
  local stat = util.uv.fs_stat(path)
  if not stat then
    fail('no socket at ' .. path, {
      'start the daemon: `xumd` (or `systemctl --user start xumd.socket`)',
      'or point the plugin at it: $XUM_SOCKET, $XUM_ROOT, or require("xum").setup{ socket = ... }',
    })
    return
  elseif stat.type ~= 'socket' then
    fail(path .. ' exists but is not a socket (' .. tostring(stat.type) .. ')')
    return
  end
  ok('socket found')

  start('xum: daemon')
  local result, err = client.request_sync('daemon.status', {}, client.config.timeout_ms)
  local hello = client.hello
  if err or not hello then
    fail('the daemon does not answer: ' .. util.format_error(err or 'no hello'))
    return
  end
  local server = hello.server or {}
  ok('hello answered: ' .. tostring(server.name or 'xumd') .. ' ' .. tostring(server.version or '?'))
  local major = tostring(hello.protocol or ''):match('^(%d+)%.')
  local ours = client.PROTOCOL:match('^(%d+)%.')
  if major == ours then
    ok('protocol ' .. tostring(hello.protocol) .. ' (the plugin speaks ' .. client.PROTOCOL .. ')')
  else
    fail('protocol ' .. tostring(hello.protocol) .. ' (the plugin speaks ' .. client.PROTOCOL .. ')')
  end
  if hello.root then
    info('root: ' .. tostring(hello.root))
  end
  if result then
    local started = tonumber(result.started_at)
    info('daemon pid ' .. tostring(result.pid) .. ', up ' .. tostring(result.uptime_s) .. ' s'
      .. (started and (' (since ' .. os.date('%Y-%m-%d %H:%M:%S', math.floor(started)) .. ')') or ''))
  end
  local caps = hello.capabilities
  if type(caps) == 'table' and not vim.tbl_contains(caps, 'events.subscribe') then
    warn('the daemon does not offer events.subscribe: no live updates')
  end
  if client.config.events then
    if require('xum.state').loaded then
      ok('subscribed to events (live updates)')
    else
      warn('not subscribed to events yet')
    end
  end
end

return M
