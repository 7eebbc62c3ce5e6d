-- One connection to xumd: newline-delimited JSON-RPC 2.0 over the Unix socket, with vim.uv.
--
-- Requests carry increasing integer ids; answers are matched by id (the daemon answers in
-- order of completion, not of arrival). Every request has a deadline: when it passes, the
-- caller gets a `timeout` error and a late answer is dropped. Notifications (`event`) go to
-- `on_notification`. When the connection ends, every request still waiting fails at once
-- with `disconnected`, saying whether it was sent (data.sent), and `on_close` runs (the client
-- decides whether to reconnect).
--
-- Callbacks run on the main loop (vim.schedule), never in luv's fast context, so they may
-- use any Neovim API.
local util = require('xum.util')
local uv = util.uv

local Conn = {}
Conn.__index = Conn

local function local_error(kind, message, extra)
  local data = { kind = kind }
  for k, v in pairs(extra or {}) do
    data[k] = v
  end
  return { code = 0, message = message, data = data, ['local'] = true }
end
Conn.local_error = local_error

-- opts: path, on_notification(method, params), on_close(reason), max_frame (bytes); host (an
-- entry, xum.host): reach that host's daemon through `ssh ... xum bridge` instead of a socket
function Conn.new(opts)
  local self = setmetatable({}, Conn)
  self.path = opts.path
  self.host = opts.host
  self.on_notification = opts.on_notification or function() end
  self.on_close = opts.on_close or function() end
  -- The daemon's default frame cap; a line longer than this without a newline is a broken
  -- peer, not a reason to buffer without bound.
  self.max_frame = opts.max_frame or 16 * 1024 * 1024
  self.pending = {}
  self.next_id = 0
  self.chunks = {}
  self.buffered = 0
  self.state = 'new'
  return self
end

local function close_handle(handle)
  if handle and not handle:is_closing() then
    handle:close()
  end
end

-- Connect, bounded by timeout_ms; cb(err) on the main loop.
function Conn:connect(timeout_ms, cb)
  assert(self.state == 'new', 'a connection is used once')
  self.state = 'connecting'
  local pipe = uv.new_pipe(false)
  self.pipe = pipe
  local timer = uv.new_timer()
  local done = false
  local function finish(err)
    if done then
      return
    end
    done = true
    timer:stop()
    close_handle(timer)
    if err then
      self.state = 'closed'
      close_handle(pipe)
    else
      self.state = 'open'
      self:_read()
    end
    vim.schedule(function()
      cb(err)
    end)
  end
  timer:start(timeout_ms, 0, function()
    finish(local_error('timeout', 'connecting to ' .. self.path .. ' took over ' .. timeout_ms .. ' ms'))
  end)
  if self.host then
    close_handle(pipe)
    return self:_spawn(finish)
  end
  -- sun_path holds 107 bytes and a NUL: some libuv versions cut a longer path short
  -- silently, which would connect to another socket than the one named.
  if #self.path > 107 then
    return finish(local_error('unreachable', 'the socket path ' .. self.path .. ' is longer than a Unix socket path can be (107 bytes): set $XUM_SOCKET or setup{ socket } to a shorter one'))
  end
  local ok, err = pcall(pipe.connect, pipe, self.path, function(cerr)
    if cerr then
      finish(local_error('unreachable', 'cannot connect to ' .. self.path .. ': ' .. tostring(cerr)))
    else
      finish(nil)
    end
  end)
  if not ok then
    finish(local_error('unreachable', 'cannot connect to ' .. self.path .. ': ' .. tostring(err)))
  end
end

-- The host's transport: ssh in a process group of its own, its stdout read as the socket
-- would be, its stdin written; stderr kept (bounded) to say why it ended.
function Conn:_spawn(finish)
  local hostmod = require('xum.host')
  local argv, argv_err = hostmod.ssh_argv(self.host)
  if not argv then
    return finish(local_error('host_error', argv_err))
  end
  local stdin, stdout, stderr = uv.new_pipe(false), uv.new_pipe(false), uv.new_pipe(false)
  self.pipe, self.wpipe, self.epipe = stdout, stdin, stderr
  self.stderr = ''
  local handle, pid = uv.spawn(argv[1], {
    args = vim.list_slice(argv, 2),
    stdio = { stdin, stdout, stderr },
    detached = true,
  }, function(code)
    self.exit_code = code
    -- What ssh leaves in its group (a ProxyCommand's child) goes with it, whether ssh ended by
    -- itself or was stopped: the group's id stays reserved while any member lives, so this
    -- reaches only them (none left: an error, ignored).
    if self.pid then
      pcall(uv.kill, -self.pid, 'sigkill')
    end
    if self.proc then
      close_handle(self.proc)
    end
    if self.on_exit then
      self.on_exit()
    end
  end)
  if not handle then
    close_handle(stdin)
    close_handle(stdout)
    close_handle(stderr)
    return finish(local_error('host_unreachable', 'cannot run ' .. argv[1] .. ': ' .. tostring(pid)))
  end
  self.proc, self.pid = handle, pid
  stderr:read_start(function(_, data)
    if data and #self.stderr < 65536 then
      self.stderr = self.stderr .. data
    end
  end)
  finish(nil)
end

-- ssh's end: wait (bounded) for its exit status, then say why the connection ended. Before any
-- answer came, nothing ran on the host: the reason is ssh's (unreachable, key refused, no xum).
-- After, calls in flight have an unknown outcome.
function Conn:_host_ended(reason)
  if self.ending then
    return -- the end of stdout, a failed write: one decision, on ssh's exit
  end
  self.ending = true
  local function decide()
    if self.state == 'closed' then
      return
    end
    local name = tostring(self.host.name or self.host.dest)
    if not self.answered then
      local kind, message = require('xum.host').classify(self.host, self.exit_code, self.stderr)
      self.peer_error = local_error(kind, message, { host = name, ssh_status = self.exit_code })
    else
      self.peer_error = local_error('connection_lost', 'the connection to host ' .. name
        .. ' was lost (' .. reason .. '); the outcome of a call in flight is unknown: look with `xum --host '
        .. name .. ' ws ls`', { host = name })
    end
    self:_closed(reason)
  end
  if self.exit_code ~= nil then
    return decide()
  end
  local timer = uv.new_timer()
  self.on_exit = function()
    timer:stop()
    close_handle(timer)
    decide()
  end
  timer:start(5000, 0, function()
    close_handle(timer)
    decide()
  end)
end

function Conn:is_open()
  return self.state == 'open'
end

function Conn:_read()
  self.pipe:read_start(function(err, data)
    if err and self.host then
      self:_host_ended('read error: ' .. tostring(err))
    elseif err then
      self:_closed('read error: ' .. tostring(err))
    elseif data == nil and self.host then
      pcall(self.pipe.read_stop, self.pipe)
      self:_host_ended('ssh ended')
    elseif data == nil then
      self:_closed('the daemon closed the connection')
    else
      self:_feed(data)
    end
  end)
end

-- Split the stream into lines; a last line stays buffered until its newline arrives.
function Conn:_feed(data)
  local start = 1
  while true do
    local nl = data:find('\n', start, true)
    if not nl then
      break
    end
    local piece = data:sub(start, nl - 1)
    local line
    if #self.chunks > 0 then
      self.chunks[#self.chunks + 1] = piece
      line = table.concat(self.chunks)
      self.chunks = {}
      self.buffered = 0
    else
      line = piece
    end
    start = nl + 1
    if line:find('%S') then
      vim.schedule(function()
        self:_message(line)
      end)
    end
  end
  if start <= #data then
    local rest = data:sub(start)
    self.chunks[#self.chunks + 1] = rest
    self.buffered = self.buffered + #rest
    if self.buffered > self.max_frame then
      self:_closed('the daemon sent a line longer than ' .. self.max_frame .. ' bytes', true)
    end
  end
end

function Conn:_message(line)
  local ok, msg = pcall(vim.json.decode, line)
  if not ok or type(msg) ~= 'table' then
    -- Not JSON: a broken peer. Drop the line; a request waiting for it times out.
    return
  end
  util.denull(msg)
  if msg.method ~= nil and msg.id == nil then
    local ok_cb, cb_err = pcall(self.on_notification, msg.method, msg.params or {})
    if not ok_cb then
      vim.notify('xum: event handler failed: ' .. tostring(cb_err), vim.log.levels.ERROR)
    end
    return
  end
  if msg.id == nil and msg.error ~= nil then
    -- An error for no request (id null): the daemon refuses the connection itself
    -- (permission_denied, frame_too_large) and closes it. It is what the waiting requests
    -- fail with, rather than a bare "disconnected".
    self.peer_error = msg.error
    return
  end
  self.answered = true
  local entry = self.pending[msg.id]
  if not entry then
    return -- an answer after its deadline, or to nobody
  end
  self.pending[msg.id] = nil
  entry.timer:stop()
  close_handle(entry.timer)
  if msg.error ~= nil then
    entry.cb(msg.error, nil)
  else
    entry.cb(nil, msg.result or {})
  end
end

-- `by_us`: this side ended it (close, a line too long), not the daemon.
function Conn:_closed(reason, by_us)
  if self.state == 'closed' then
    return
  end
  self.state = 'closed'
  if self.pipe then
    pcall(self.pipe.read_stop, self.pipe)
    close_handle(self.pipe)
  end
  close_handle(self.wpipe)
  close_handle(self.epipe)
  if self.pid and self.exit_code == nil then
    -- ssh and whatever it started (a ProxyCommand): its own group
    pcall(uv.kill, -self.pid, 'sigterm')
  end
  vim.schedule(function()
    local pending = self.pending
    self.pending = {}
    -- Ended from this side, the oldest request not yet sent may be partly written: the daemon
    -- reads what came and the end of input, and a frame cut only before its newline is a whole
    -- request it runs. Its outcome is unknown; never say it was not sent.
    local partly = nil
    if by_us then
      for id, entry in pairs(pending) do
        if not entry.sent and (partly == nil or id < partly) then
          partly = id
        end
      end
    end
    for id, entry in pairs(pending) do
      entry.timer:stop()
      close_handle(entry.timer)
      entry.cb(self.peer_error or Conn.lost(entry.method, entry.sent or id == partly, reason), nil)
    end
    if self.peer_error then
      reason = util.format_error(self.peer_error)
    end
    self.on_close(reason)
  end)
end

-- The error of a request whose connection ended (`reason`) before its answer: `sent` says
-- whether it went out (then the daemon may or may not have done it) or never did (the daemon
-- never saw it); data.sent and data.method say the same to code.
function Conn.lost(method, sent, reason)
  local message
  if sent then
    message = method .. ' was sent and the connection to xumd was lost before its answer (' .. reason
      .. '): the daemon may or may not have done it (it finishes or rolls back on its own); look before retrying'
  else
    message = method .. ' was not sent: the connection to xumd was lost before the request went out ('
      .. reason .. '); the daemon never saw it'
  end
  return local_error('disconnected', message, { method = method, sent = sent and true or false })
end

-- Close from our side (no reconnect is implied: that is the client's business).
function Conn:close(reason)
  self:_closed(reason or 'closed by the plugin', true)
end

-- Send a request; cb(err, result) on the main loop, exactly once, within timeout_ms.
function Conn:request(method, params, timeout_ms, cb)
  if self.state ~= 'open' then
    vim.schedule(function()
      cb(Conn.lost(method, false, 'not connected to xumd'), nil)
    end)
    return nil
  end
  self.next_id = self.next_id + 1
  local id = self.next_id
  local frame = vim.json.encode({
    jsonrpc = '2.0',
    id = id,
    method = method,
    -- An empty Lua table would encode as [] (positional params): send {}.
    params = (params == nil or next(params) == nil) and vim.empty_dict() or params,
  }) .. '\n'
  local timer = uv.new_timer()
  local entry = { cb = cb, timer = timer, method = method, sent = false }
  self.pending[id] = entry
  timer:start(timeout_ms, 0, function()
    vim.schedule(function()
      local waiting = self.pending[id]
      if waiting then
        self.pending[id] = nil
        close_handle(waiting.timer)
        waiting.cb(local_error('timeout', method .. ': no answer within ' .. timeout_ms .. ' ms', { waited_for = method }), nil)
      end
    end)
  end)
  ;(self.wpipe or self.pipe):write(frame, function(err)
    if err and self.host then
      -- ssh ended before the frame went in (a host that is down): why is ssh's to say, as
      -- when its output ends, never a bare "disconnected"
      self:_host_ended('write error: ' .. tostring(err))
    elseif err then
      self:_closed('write error: ' .. tostring(err))
    elseif self.state ~= 'closed' then
      -- handed to the kernel: from here its outcome is unknown should the connection end
      entry.sent = true
    end
  end)
  return id
end

return Conn
