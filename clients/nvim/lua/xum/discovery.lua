-- Finding the daemon's socket: the one rule every xum client follows (docs/PROTOCOL.md,
-- "Finding the daemon"; xum_protocol.discovery in Python). The first that applies:
--
--   1. setup{ socket = ... }          (explicit, like the CLI's --socket)
--   2. setup{ root = ... }/xumd.sock  (explicit, like the CLI's --root)
--   3. $XUM_SOCKET
--   4. $XUM_ROOT/xumd.sock
--   5. the default root: $XDG_STATE_HOME/xum, else ~/.local/state/xum, then /xumd.sock
--
-- An empty value counts as unset; a leading ~ is $HOME. No search and no fallback: a
-- missing socket means no daemon there.
local M = {}

local function nonempty(value)
  if type(value) == 'string' and value ~= '' then
    return value
  end
  return nil
end

-- Returns the socket path and where it came from (shown by :checkhealth xum).
-- `opts` holds the setup options; `env` (a function name -> value) is for tests.
function M.socket_path(opts, env)
  opts = opts or {}
  env = env or os.getenv
  local function home()
    return nonempty(env('HOME')) or require('xum.util').uv.os_homedir()
  end
  -- A leading "~" (alone or before "/") is $HOME, in a setting and a variable alike: no shell
  -- expanded them. Nothing else is expanded (no $VAR, no wildcard).
  local function expand(path)
    if path == '~' or path:sub(1, 2) == '~/' then
      return home() .. path:sub(2)
    end
    return path
  end
  local explicit = nonempty(opts.socket)
  if explicit then
    return expand(explicit), 'setup{ socket }'
  end
  local root = nonempty(opts.root)
  if root then
    return expand(root) .. '/xumd.sock', 'setup{ root }'
  end
  local from_env = nonempty(env('XUM_SOCKET'))
  if from_env then
    return expand(from_env), '$XUM_SOCKET'
  end
  root = nonempty(env('XUM_ROOT'))
  if root then
    return expand(root) .. '/xumd.sock', '$XUM_ROOT'
  end
  local state = nonempty(env('XDG_STATE_HOME'))
  if state then
    return expand(state) .. '/xum/xumd.sock', 'default root ($XDG_STATE_HOME/xum)'
  end
  return home() .. '/.local/state/xum/xumd.sock', 'default root (~/.local/state/xum)'
end

return M
