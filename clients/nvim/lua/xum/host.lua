-- A daemon on another machine, reached through OpenSSH (docs/HOSTS.md): the plugin runs
-- `ssh ... xum bridge` with vim.uv.spawn and speaks the same NDJSON JSON-RPC over its pipes.
-- The same command as the Python client's (xum_client.hosts.ssh_command):
--   ssh -T -o BatchMode=yes [-o K=V ...] -- DEST 'sh' '-c' '<script>' 'xum' 'bridge' ['--root' R]
-- where the script runs the xum `xum host install` put under the host's data directory, else
-- `xum` from PATH. $XUM_SSH replaces `ssh` (split as a shell would: M.split_words).
--
-- setup{ host = ... } takes an entry { name, dest, remote_root?, ssh_options? } or a host's
-- name, looked up in the hosts file with the local `xum host ls --json`.
local M = {}

M.REMOTE_XUM_SCRIPT = 'x="${XDG_DATA_HOME:-$HOME/.local/share}/xum/venv/bin/xum"; '
  .. 'if [ -x "$x" ]; then exec "$x" "$@"; fi; '
  .. 'if command -v xum >/dev/null 2>&1; then exec xum "$@"; fi; '
  .. 'if [ -x "$HOME/.local/bin/xum" ]; then exec "$HOME/.local/bin/xum" "$@"; fi; '
  .. 'exec xum "$@"'

-- `s` quoted for a POSIX shell.
function M.quote(s)
  if s:match('^[%w@%%+=:,./_-]+$') then
    return s
  end
  return "'" .. s:gsub("'", [['"'"']]) .. "'"
end

-- The entry for setup{ host }: a table as given, or a name from the hosts file, read with the
-- local CLI (`xum host ls --json`, bounded: 10 s).
function M.resolve(host)
  if type(host) == 'table' then
    return host, nil
  end
  local cli = os.getenv('XUM_CLI') or 'xum'
  local out, err_out = {}, {}
  local ok, job = pcall(vim.fn.jobstart, { cli, 'host', 'ls', '--json' }, {
    stdout_buffered = true,
    stderr_buffered = true,
    on_stdout = function(_, data)
      out = data
    end,
    on_stderr = function(_, data)
      err_out = data
    end,
  })
  if not ok or job <= 0 then
    return nil, 'cannot run `' .. cli .. ' host ls --json` to find host ' .. tostring(host)
  end
  local code = vim.fn.jobwait({ job }, 10000)[1]
  if code == -1 then
    vim.fn.jobstop(job)
    return nil, '`' .. cli .. ' host ls --json` did not answer within 10 s'
  end
  if code ~= 0 then
    return nil, 'cannot read the hosts file: ' .. vim.trim(table.concat(err_out, ' '))
  end
  local decoded_ok, data = pcall(vim.json.decode, table.concat(out, '\n'))
  if decoded_ok and type(data) == 'table' then
    for _, entry in ipairs(data.hosts or {}) do
      if entry.name == host then
        require('xum.util').denull(entry)
        return entry, nil
      end
    end
  end
  return nil, 'no host ' .. tostring(host) .. ' in the hosts file (`xum host ls`)'
end

-- `text` split into words as Python's shlex.split does (POSIX rules: '...' literal, "..." where
-- a backslash escapes only " and \, a backslash outside quotes escapes any character), so that
-- $XUM_SSH means the same words to every client (a path with a space in quotes stays one word).
-- nil and a message for an unclosed quote or a trailing backslash.
function M.split_words(text)
  local words, word, quote = {}, nil, nil
  local i, n = 1, #text
  while i <= n do
    local c = text:sub(i, i)
    if quote == "'" then
      if c == "'" then
        quote = nil
      else
        word = word .. c
      end
    elseif quote == '"' then
      if c == '"' then
        quote = nil
      elseif c == '\\' and i < n then
        local nxt = text:sub(i + 1, i + 1)
        word = word .. ((nxt == '"' or nxt == '\\') and nxt or (c .. nxt))
        i = i + 1
      else
        word = word .. c
      end
    elseif c == "'" or c == '"' then
      quote = c
      word = word or ''
    elseif c == '\\' then
      if i == n then
        return nil, 'No escaped character'
      end
      word = (word or '') .. text:sub(i + 1, i + 1)
      i = i + 1
    elseif c:match('^[ \t\r\n]$') then
      if word then
        words[#words + 1] = word
      end
      word = nil
    else
      word = (word or '') .. c
    end
    i = i + 1
  end
  if quote then
    return nil, 'No closing quotation'
  end
  if word then
    words[#words + 1] = word
  end
  return words, nil
end

-- The ssh to run: $XUM_SSH split as a shell would, else `ssh`; nil and a message when it
-- cannot be split.
function M.ssh_program()
  local text = os.getenv('XUM_SSH')
  if text == nil or text == '' then
    text = 'ssh'
  end
  local words, err = M.split_words(text)
  if not words then
    return nil, 'cannot split $XUM_SSH ' .. vim.inspect(text) .. ': ' .. err
  end
  if #words == 0 then
    words = { 'ssh' }
  end
  return words, nil
end

-- The argv that runs the bridge on the host, or nil and a message.
function M.ssh_argv(entry)
  local argv, err = M.ssh_program()
  if not argv then
    return nil, err
  end
  vim.list_extend(argv, { '-T', '-o', 'BatchMode=yes' })
  local keys = vim.tbl_keys(entry.ssh_options or {})
  table.sort(keys)
  for _, key in ipairs(keys) do
    vim.list_extend(argv, { '-o', key .. '=' .. entry.ssh_options[key] })
  end
  local words = { 'sh', '-c', M.REMOTE_XUM_SCRIPT, 'xum', 'bridge' }
  if entry.remote_root and entry.remote_root ~= '' then
    vim.list_extend(words, { '--root', entry.remote_root })
  end
  local quoted = {}
  for i, w in ipairs(words) do
    quoted[i] = M.quote(w)
  end
  vim.list_extend(argv, { '--', entry.dest, table.concat(quoted, ' ') })
  return argv
end

-- Why a host could not be reached, from ssh's exit status and stderr: the kind
-- (host_unreachable, host_key_refused, host_key_unverified, xum_missing, bridge_failed) and
-- the message, those of the Python client's sshlink.classify word for word (a shared table of
-- cases holds both to it: tests/support/ssh_failures.json).
function M.classify(entry, code, stderr)
  stderr = stderr or ''
  local detail = ''
  for line in stderr:gmatch('[^\n]+') do
    if line:find('%S') then
      detail = vim.trim(line)
    end
  end
  local name = tostring(entry.name or entry.dest)
  local where = "host '" .. name .. "' (" .. entry.dest .. ')'
  local function has(mark)
    return stderr:find(mark, 1, true) ~= nil
  end
  if code == 255 then
    if has('Host key verification failed') or has('HOST IDENTIFICATION HAS CHANGED') then
      return 'host_key_unverified', where .. ": ssh could not verify the host's key (" .. detail
        .. '): it is unknown or has changed; check it and accept it with `ssh ' .. entry.dest .. '` once'
    end
    if has('Permission denied') or has('Too many authentication failures') then
      return 'host_key_refused', where .. ' refused the key: ' .. (detail ~= '' and detail or 'permission denied')
        .. ' (ssh -v ' .. entry.dest .. ' shows which keys were offered)'
    end
    return 'host_unreachable', where .. ' is unreachable: ' .. (detail ~= '' and detail or 'ssh failed')
  end
  if code == 127 then
    return 'xum_missing', 'xum is not installed on ' .. where .. ' (' .. (detail ~= '' and detail or 'command not found')
      .. '): install it with `xum host install ' .. name .. '`, or put xum on the PATH of its non-interactive shell'
  end
  return 'bridge_failed', 'the bridge on ' .. where .. ' failed (ssh exit ' .. tostring(code) .. '): '
    .. (detail ~= '' and detail or 'no message')
end

return M
