-- :checkhealth xum — Neovim, the socket (or, with setup{ host }, the host's entry and ssh), the
-- daemon's hello and protocol.
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

  local advice
  if client.config.host ~= nil then
    advice = M.check_host(start, ok, fail, info)
    if not advice then
      return
    end
  else
    advice = M.check_socket(start, ok, fail, info)
    if not advice then
      return
    end
  end

  start('xum: daemon')
  local result, err = client.request_sync('daemon.status', {}, client.config.timeout_ms)
  local hello = client.hello
  if err or not hello then
    fail('the daemon does not answer: ' .. util.format_error(err or 'no hello'), advice(err))
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

-- The local socket: found, and a socket. The advice for a daemon that does not answer, or nil
-- after an error (nothing more to check).
function M.check_socket(start, ok, fail, info)
  local path, source = require('xum.client').socket_path()
  start('xum: daemon socket')
  info('socket: ' .. path .. ' (from ' .. source .. ')')
  local stat = require('xum.util').uv.fs_stat(path)
  if not stat then
    fail('no socket at ' .. path, {
      'start the daemon: `xum daemon run` (or `systemctl --user start xumd.socket`)',
      'or point the plugin at it: $XUM_SOCKET, $XUM_ROOT, or require("xum").setup{ socket = ... }',
    })
    return nil
  elseif stat.type ~= 'socket' then
    fail(path .. ' exists but is not a socket (' .. tostring(stat.type) .. ')')
    return nil
  end
  ok('socket found')
  return function()
    return { 'start the daemon: `xum daemon run` (or `systemctl --user start xumd.socket`)' }
  end
end

-- What to do about a host that does not answer, by the error's kind.
local HOST_ADVICE = {
  host_unreachable = 'make `ssh %s true` work from here (the host up, its name, ConnectTimeout)',
  host_key_refused = 'give ssh a key the host accepts (`ssh-copy-id %s`), or an agent that holds it',
  host_key_unverified = "connect once with `ssh %s` and check the host's key",
  xum_missing = 'install xum there: `xum host install %s`',
}

-- setup{ host }: the host's entry (a name is looked up with `xum host ls --json`) and the ssh
-- command; the daemon is reached through it, there is no local socket to look for. The advice
-- for a host that does not answer, or nil after an error.
function M.check_host(start, ok, fail, info)
  local host = require('xum.host')
  local given = require('xum.client').config.host
  start('xum: host')
  local entry, err = host.resolve(given)
  if not entry then
    fail(err, {
      'add it: `xum host add NAME DEST` (`xum host ls` lists the hosts file)',
      'or give the entry itself: require("xum").setup{ host = { name = ..., dest = ... } }',
    })
    return nil
  end
  local name = tostring(entry.name or entry.dest)
  info('host ' .. name .. ': ' .. tostring(entry.dest)
    .. (entry.remote_root and entry.remote_root ~= '' and (', root ' .. entry.remote_root) or ''))
  local argv, argv_err = host.ssh_argv(entry)
  if not argv then
    fail(argv_err, { 'fix $XUM_SSH: it is split as a shell would split it' })
    return nil
  end
  ok('reached through `' .. argv[1] .. ' ' .. tostring(entry.dest) .. ' xum bridge`')
  return function(daemon_err)
    local kind = require('xum.util').kind(daemon_err)
    local first = HOST_ADVICE[kind]
    local advice = {}
    if first then
      advice[1] = first:format(kind == 'xum_missing' and name or tostring(entry.dest))
    end
    advice[#advice + 1] = '`xum host check ' .. name .. '` says what the command line sees'
    return advice
  end
end

return M
