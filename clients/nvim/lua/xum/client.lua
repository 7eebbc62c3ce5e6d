-- The plugin's one connection to xumd: connect, `hello`, subscribe to events, and
-- reconnect when the daemon goes away (a restart, a crash), resuming the event stream
-- after the last sequence number it saw.
local Conn = require('xum.rpc')
local methods = require('xum.methods')
local discovery = require('xum.discovery')
local state = require('xum.state')
local util = require('xum.util')

local M = {
  -- 1.1: events.subscribe resumes after {after_seq, epoch}; a 1.0 daemon gets a plain
  -- subscribe (same major version: compatible)
  PROTOCOL = '1.1',
  VERSION = '0.1.0',
  config = {
    socket = nil,
    root = nil,
    -- a host (docs/HOSTS.md): { name, dest, remote_root?, ssh_options? } or a name from the
    -- hosts file; the daemon there is reached through `ssh ... xum bridge`
    host = nil,
    -- a connect attempt; a quick request; a structural one (create, archive, ...)
    connect_timeout_ms = 2000,
    timeout_ms = 10000,
    long_timeout_ms = 300000,
    events = true,
    reconnect = true,
    -- a mutating call whose answer was lost after it was sent is sent once more, with the
    -- request key it went with, on a new connection (docs/PROTOCOL.md, "Request keys")
    retry_lost = true,
    -- backoff between reconnect attempts, doubling up to the cap
    reconnect_min_ms = 100,
    reconnect_max_ms = 5000,
    -- the longest line accepted from the daemon (its own default frame cap)
    max_frame_bytes = 16 * 1024 * 1024,
    -- workspaces per answer, for the subscription's snapshot (protocol 1.3) and for listings
    -- (list_workspaces): a root of any size never makes one answer past the frame cap. 1 to
    -- 10000; 0: everything in one answer (what a daemon before 1.2/1.3 gets anyway).
    page = 500,
  },
  conn = nil,
  hello = nil,
  -- 'idle' | 'connecting' | 'ready' | 'offline'
  status = 'idle',
  last_error = nil,
  -- counts successful connections (a reconnect makes it 2, ...), and attempts
  connections = 0,
  attempts = 0,
  -- how the last subscribe went: 'snapshot' | 'resumed' | 'resync'
  last_subscribe = nil,
  waiters = {},
  stopped = false,
}

local uv = util.uv
local reconnect_timer = nil
local backoff = nil

-- Methods that may wait on git, scripts or a bounded drain.
local LONG = {
  ['workspace.create'] = true,
  ['workspace.archive'] = true,
  ['workspace.unarchive'] = true,
  ['workspace.remove'] = true,
  ['workspace.rename'] = true,
  ['project.remove'] = true,
  ['process.release_all'] = true,
}

function M.socket_path()
  local host = M.config.host
  if host ~= nil then
    return 'ssh:' .. tostring(type(host) == 'table' and (host.name or host.dest) or host), 'setup{ host }'
  end
  return discovery.socket_path(M.config)
end

local function flush(err)
  local waiters = M.waiters
  M.waiters = {}
  for _, cb in ipairs(waiters) do
    local ok, cb_err = pcall(cb, err)
    if not ok then
      vim.notify('xum: ' .. tostring(cb_err), vim.log.levels.ERROR)
    end
  end
end

local function schedule_reconnect()
  if M.stopped or not M.config.reconnect then
    return
  end
  if reconnect_timer then
    return
  end
  backoff = backoff and math.min(backoff * 2, M.config.reconnect_max_ms) or M.config.reconnect_min_ms
  reconnect_timer = uv.new_timer()
  reconnect_timer:start(backoff, 0, function()
    vim.schedule(function()
      if reconnect_timer then
        reconnect_timer:stop()
        reconnect_timer:close()
        reconnect_timer = nil
      end
      if M.status ~= 'ready' and M.status ~= 'connecting' and not M.stopped then
        M.ensure(function() end)
      end
    end)
  end)
end

-- Events that arrive while the subscribe answer is on its way are held, then applied
-- after the snapshot (the daemon registers the listener before it answers).
local held = nil

local function on_notification(method, params)
  if method ~= 'event' then
    return
  end
  if held then
    held[#held + 1] = params
    return
  end
  state.apply_event(params)
end

local function refresh_obligations(conn)
  conn:request('cleanup.list', { state = 'pending' }, M.config.timeout_ms, function(err, result)
    if not err then
      state.merge_obligations(result.obligations)
    end
  end)
end

-- Does the daemon resume event streams (protocol 1.1 or later)?
function M.server_resumes()
  local protocol = M.hello and M.hello.protocol
  local major, minor = tostring(protocol or ''):match('^(%d+)%.(%d+)')
  return major ~= nil and (tonumber(major) > 1 or tonumber(minor) >= 1)
end

-- The answer of a subscribe (its snapshot whole), then the events that came meanwhile.
local function subscribed(conn, result, resuming, had_state, queued, done)
  local same_run = resuming and result.epoch == state.epoch
  if same_run and not result.resync_required then
    M.last_subscribe = 'resumed'
    -- A daemon may hand back what was missed in the answer, or send it as events.
    if type(result.events) == 'table' then
      for _, ev in ipairs(result.events) do
        state.apply_event(ev)
      end
    end
    -- Every event of our types up to `seq` was in the replay; later ones follow as
    -- notifications (a filtered stream has gaps: other types' numbers).
    local upto = tonumber(result.seq)
    if upto and (state.seq == nil or upto > state.seq) then
      state.seq = upto
    end
  else
    M.last_subscribe = had_state and 'resync' or 'snapshot'
    state.apply_snapshot(result.epoch, tonumber(result.seq), result.snapshot)
  end
  for _, ev in ipairs(queued) do
    state.apply_event(ev)
  end
  refresh_obligations(conn)
  done(nil)
end

-- `workspace.list` from `after` to the end, M.config.page at a time, through `request`
-- (method, params, cb); cb(err, list) with `list` (appended to `acc`) in the listing order.
-- A daemon before 1.2 (no paging: `limit` is invalid_params) answers everything at once.
local function page_through(request, filters, after, acc, cb)
  local params = {}
  for k, v in pairs(filters or {}) do
    params[k] = v
  end
  local page = tonumber(M.config.page) or 0
  if page > 0 then
    params.limit = page
  end
  if after ~= nil then
    params.after = after
  end
  request('workspace.list', params, function(err, result)
    if err and after == nil and params.limit ~= nil and util.kind(err) == 'invalid_params' then
      local whole = vim.deepcopy(filters or {})
      return request('workspace.list', whole, function(werr, wresult)
        if werr then
          return cb(werr, nil)
        end
        vim.list_extend(acc, wresult.workspaces or {})
        cb(nil, acc)
      end)
    end
    if err then
      return cb(err, nil)
    end
    vim.list_extend(acc, result.workspaces or {})
    local nxt = util.nn(result.next)
    if nxt == nil or params.limit == nil then
      return cb(nil, acc)
    end
    -- Taken as the end, a `next` that is no cursor would make a listing cut short look whole;
    -- one that does not advance would page for ever.
    if type(nxt) ~= 'string' or nxt == after then
      return cb(Conn.local_error('protocol', 'workspace.list answered a `next` that does not go on: '
        .. vim.inspect(nxt)), nil)
    end
    page_through(request, filters, nxt, acc, cb)
  end)
end

-- Every workspace (`filters`: project_id, state), page by page; cb(err, list) on the main loop.
function M.list_workspaces(filters, cb, timeout_ms)
  page_through(function(method, params, done)
    M.request(method, params, done, timeout_ms)
  end, filters, nil, {}, cb)
end

-- Subscribe, resuming after what we saw when the same daemon run (epoch) is still there.
-- `whole`: without `snapshot_limit` (a daemon before 1.3).
local function subscribe(conn, done, plain, whole)
  -- script.started: setup progress of what this editor creates or restores (its printed
  -- lines are not asked for: too many to show)
  local params = { types = { 'workspace.', 'project.', 'cleanup.', 'script.started' } }
  local had_state = state.loaded and state.epoch ~= nil and state.seq ~= nil
  local resuming = had_state and not plain and M.server_resumes()
  if resuming then
    params.after_seq = state.seq
    params.epoch = state.epoch
  end
  local page = tonumber(M.config.page) or 0
  if page > 0 and not whole then
    params.snapshot_limit = page
  end
  -- This subscription's events; a later one (another connection) holds its own, and this one's
  -- late callbacks never drop them.
  local mine = {}
  held = mine
  local function release()
    if held == mine then
      held = nil
    end
    return mine
  end
  conn:request('events.subscribe', params, M.config.timeout_ms, function(err, result)
    if err and params.snapshot_limit and util.kind(err) == 'invalid_params' then
      -- A daemon before 1.3: the whole snapshot in one answer.
      release()
      return subscribe(conn, done, plain, true)
    end
    if err and resuming and util.kind(err) == 'invalid_params' then
      -- A daemon without resumption: a plain subscribe and its snapshot.
      release()
      return subscribe(conn, done, true, whole)
    end
    if err then
      release()
      return done(err)
    end
    local rest = util.nn(result.workspaces_next)
    if rest ~= nil and type(result.snapshot) == 'table' then
      -- A bounded snapshot: its other workspaces page by page on this connection, events held
      -- meanwhile (docs/PROTOCOL.md, "A bounded snapshot"); the state changes only once it is
      -- whole, so a connection lost in between resumes from where the state still is.
      local first = type(result.snapshot.workspaces) == 'table' and result.snapshot.workspaces or {}
      return page_through(function(method, p, cb)
        conn:request(method, p, M.config.timeout_ms, cb)
      end, {}, rest, first, function(perr, all)
        if perr then
          release()
          return done(perr)
        end
        result.snapshot.workspaces = all
        result.workspaces_next = nil
        subscribed(conn, result, resuming, had_state, release(), done)
      end)
    end
    subscribed(conn, result, resuming, had_state, release(), done)
  end)
end


local function on_close(conn, reason)
  if M.conn ~= conn then
    return
  end
  M.conn = nil
  M.hello = nil
  M.status = 'offline'
  M.last_error = reason
  held = nil
  state.changed()
  schedule_reconnect()
end

local LOCAL_HINT = 'restart the daemon from this installation (`xum daemon stop`, then start it '
  .. 'again), or use the xum that matches it'

-- major, minor of a release string ('0.1.0', '1.2.3rc1'); nil when it does not start with two
-- numbers (the Python client's release_line).
function M.release_line(version)
  local major, minor = tostring(version):match('^(%d+)%.(%d+)')
  if not major or #major > 6 or #minor > 6 then
    return nil
  end
  return tonumber(major), tonumber(minor)
end

-- nil, or the `version_mismatch` error for a daemon of another xum major.minor (or one whose
-- version cannot be read): the Python client's check_release, its message word for word.
function M.check_release(hello, host)
  local server = type(hello) == 'table' and hello.server or nil
  local theirs = type(server) == 'table' and server.version or nil
  if type(theirs) ~= 'string' or theirs == '' then
    theirs = '(unknown version)'
  end
  local a1, a2 = M.release_line(theirs)
  local b1, b2 = M.release_line(M.VERSION)
  if a1 ~= nil and a1 == b1 and a2 == b2 then
    return nil
  end
  local where, hint
  if host then
    local name = tostring(host.name or host.dest)
    local root = host.remote_root or ''
    where = 'on host ' .. name .. (root ~= '' and (' (' .. root .. ')') or '')
    hint = 'run `xum host install ' .. name .. '` to put this version there, then stop its daemon '
      .. '(`xum --host ' .. name .. ' daemon stop`) so the next connection starts the new one'
  else
    local root = type(hello) == 'table' and type(hello.root) == 'string' and hello.root or M.socket_path()
    where = 'on ' .. root
    hint = LOCAL_HINT
  end
  return Conn.local_error(
    'version_mismatch',
    'this client is xum ' .. M.VERSION .. ' but the daemon ' .. where .. ' is xumd ' .. theirs
      .. ': their versions differ (major.minor); ' .. hint,
    { client_version = M.VERSION, server_version = theirs, where = where }
  )
end

-- Connect (once at a time), say hello, subscribe; cb(err) when ready or failed.
function M.ensure(cb)
  if M.status == 'ready' and M.conn and M.conn:is_open() then
    vim.schedule(function()
      cb(nil)
    end)
    return
  end
  M.waiters[#M.waiters + 1] = cb
  if M.status == 'connecting' then
    return
  end
  M.stopped = false
  M.status = 'connecting'
  M.attempts = M.attempts + 1
  local path = M.socket_path()
  local host_entry, host_err = nil, nil
  if M.config.host ~= nil then
    host_entry, host_err = require('xum.host').resolve(M.config.host)
  end
  local conn
  conn = Conn.new({
    path = path,
    host = host_entry,
    max_frame = M.config.max_frame_bytes,
    on_notification = on_notification,
    on_close = function(reason)
      on_close(conn, reason)
    end,
  })
  local function fail(err)
    if M.conn == conn then
      M.conn = nil
    end
    conn:close('setup failed')
    M.status = 'offline'
    M.last_error = err.message
    flush(err)
    -- Retrying cannot help these: another major version, another release (until someone
    -- restarts that daemon), a socket of another user.
    local kind = util.kind(err)
    if kind ~= 'protocol_mismatch' and kind ~= 'version_mismatch' and kind ~= 'permission_denied' then
      schedule_reconnect()
    end
  end
  if host_err then
    return fail(Conn.local_error('host_error', host_err))
  end
  conn:connect(M.config.connect_timeout_ms, function(err)
    if err then
      return fail(err)
    end
    if M.stopped then
      return fail(Conn.local_error('disconnected', 'stopped while connecting'))
    end
    M.conn = conn
    local hello = {
      protocol = M.PROTOCOL,
      client = { name = 'xum.nvim', version = M.VERSION },
    }
    conn:request('hello', hello, M.config.timeout_ms, function(herr, result)
      if herr then
        return fail(herr)
      end
      local mismatch = M.check_release(result, host_entry)
      if mismatch then
        return fail(mismatch)
      end
      M.hello = result
      local function ready(serr)
        if serr then
          return fail(serr)
        end
        M.status = 'ready'
        M.last_error = nil
        M.connections = M.connections + 1
        backoff = nil
        state.changed()
        flush(nil)
      end
      if M.config.events then
        subscribe(conn, ready)
      else
        ready(nil)
      end
    end)
  end)
end

local KEY_CHARS = 'abcdefghijklmnopqrstuvwxyz0123456789'

-- A new request key: 32 random letters and digits (the daemon takes 1 to 128 of `[A-Za-z0-9._:-]`).
local function new_key()
  local ok, bytes = pcall(uv.random, 32, nil)
  local random = ok and type(bytes) == 'string' and #bytes == 32
  local key = {}
  for i = 1, 32 do
    local at = (random and bytes:byte(i) or math.random(0, 255)) % #KEY_CHARS + 1
    key[i] = KEY_CHARS:sub(at, at)
  end
  return table.concat(key)
end

-- `params` of a mutating method with a request key (a new one unless they hold one): a copy,
-- or `params` itself for a read.
function M.with_request_key(method, params)
  if not methods.MUTATING[method] or (params ~= nil and type(params) ~= 'table') then
    return params
  end
  local keyed = vim.deepcopy(params or {})
  if type(keyed.request_key) ~= 'string' then
    keyed.request_key = new_key()
  end
  return keyed
end

-- Call a method; cb(err, result) on the main loop, within the method's deadline. A mutating
-- call carries a request key; when its answer was lost after it was sent (`disconnected` with
-- data.sent), it is sent once more with that key on a new connection, within what is left of
-- its deadline: the daemon answers the first call's outcome rather than doing it twice.
function M.request(method, params, cb, timeout_ms)
  timeout_ms = timeout_ms or (LONG[method] and M.config.long_timeout_ms or M.config.timeout_ms)
  if not methods.MUTATING[method] then
    return M.send(method, params, cb, timeout_ms)
  end
  local keyed = M.with_request_key(method, params)
  if not M.config.retry_lost then
    return M.send(method, keyed, cb, timeout_ms)
  end
  local deadline = uv.now() + timeout_ms
  M.send(method, keyed, function(err, result)
    local data = err and util.nn(err.data)
    local lost = type(data) == 'table' and data.kind == 'disconnected' and data.sent == true
    local left = deadline - uv.now()
    if not lost or left <= 0 or M.stopped then
      return cb(err, result)
    end
    -- after the closed connection's own bookkeeping (on_close runs once its calls are told)
    vim.schedule(function()
      M.send(method, keyed, function(again, answer)
        if again and again['local'] then
          -- no daemon answered the repeat either: the first call's outcome is still unknown
          local unknown = vim.deepcopy(err)
          unknown.message = err.message .. ' (sent again with its request key: ' .. again.message .. ')'
          return cb(unknown, nil)
        end
        cb(again, answer)
      end, left)
    end)
  end, timeout_ms)
end

-- One attempt of a call: connect if needed, send, cb(err, result) within `timeout_ms`.
function M.send(method, params, cb, timeout_ms)
  M.ensure(function(err)
    if err then
      return cb(err, nil)
    end
    if not M.conn then
      -- it closed between "ready" and this turn of the loop
      return cb(Conn.lost(method, false, 'the connection to xumd closed'), nil)
    end
    M.conn:request(method, params, timeout_ms, cb)
  end)
end

-- The same, waiting on the main loop (health check, completion); never past the deadline.
function M.request_sync(method, params, timeout_ms)
  timeout_ms = timeout_ms or M.config.timeout_ms
  local done, err_out, result_out = false, nil, nil
  M.request(method, params, function(err, result)
    done, err_out, result_out = true, err, result
  end, timeout_ms)
  -- the connect and hello come first: allow for them on top of the request's own deadline
  local limit = timeout_ms + 2 * M.config.connect_timeout_ms
  if not vim.wait(limit, function()
    return done
  end, 10) then
    return nil, Conn.local_error('timeout', method .. ': no answer within ' .. limit .. ' ms')
  end
  return result_out, err_out
end

-- Is a reconnect attempt scheduled (a retry after the backoff)?
function M.reconnecting()
  return reconnect_timer ~= nil
end

-- Drop the connection and stop reconnecting (setup() with a new socket, tests).
function M.stop()
  M.stopped = true
  if reconnect_timer then
    reconnect_timer:stop()
    reconnect_timer:close()
    reconnect_timer = nil
  end
  backoff = nil
  local conn = M.conn
  M.conn = nil
  M.status = 'idle'
  if conn then
    conn:close('stopped')
  end
end

return M
