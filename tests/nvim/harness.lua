-- Runs one scenario of tests/nvim/scenarios.lua in a headless Neovim, for
-- tests/clients/test_nvim_plugin.py. The scenario's name is $XUM_NVIM_SCENARIO; the exit status
-- says how it went (0 passed, 1 failed: the reason on stderr). Every wait has a deadline.
local function out(msg)
  io.stderr:write(msg .. '\n')
end

local T = {}
local uv = vim.uv or vim.loop
T.notes = {}

-- Record what the plugin tells the user instead of showing it.
vim.notify = function(msg, level)
  T.notes[#T.notes + 1] = { msg = tostring(msg), level = level or vim.log.levels.INFO }
  out('notify[' .. tostring(level) .. ']: ' .. tostring(msg))
end

function T.fail(msg)
  error('ASSERTION: ' .. msg, 2)
end

function T.check(cond, msg)
  if not cond then
    error('ASSERTION: ' .. msg, 2)
  end
  return cond
end

function T.eq(got, want, msg)
  if not vim.deep_equal(got, want) then
    error('ASSERTION: ' .. msg .. ': got ' .. vim.inspect(got) .. ', want ' .. vim.inspect(want), 2)
  end
end

function T.wait_for(fn, what, ms)
  ms = ms or 60000
  local value
  local ok = vim.wait(ms, function()
    value = fn()
    return value
  end, 20)
  if not ok then
    error('ASSERTION: timed out after ' .. ms .. ' ms waiting for ' .. what, 2)
  end
  return value
end

-- Wait for a notification whose text matches `pattern` (plain find), after index `from`.
-- An error notification that does not match ends the wait at once (it will not come).
function T.note(pattern, from, ms)
  return T.wait_for(function()
    for i = (from or 0) + 1, #T.notes do
      if T.notes[i].msg:find(pattern, 1, true) then
        return T.notes[i]
      end
      if T.notes[i].level == vim.log.levels.ERROR then
        T.fail('waiting for ' .. vim.inspect(pattern) .. ', got the error: ' .. T.notes[i].msg)
      end
    end
  end, 'a notification with ' .. vim.inspect(pattern), ms)
end

function T.mark()
  return #T.notes
end

-- Run an Ex command and return the text of the first notification after it.
function T.answer(cmd)
  local m = T.mark()
  vim.cmd(cmd)
  return T.wait_for(function()
    return T.notes[m + 1]
  end, 'an answer to ' .. cmd).msg
end

-- Run `xum` (the real CLI, a separate client) against the same daemon.
function T.cli(args)
  local cmd = { os.getenv('XUM_CLI'), '--json' }
  vim.list_extend(cmd, args)
  local output = vim.fn.system(cmd)
  if vim.v.shell_error ~= 0 then
    T.fail('xum ' .. table.concat(args, ' ') .. ' failed: ' .. output)
  end
  return vim.json.decode(output)
end

-- Ask the pytest driver to do something (restart the daemon) and wait until it is done.
function T.ask_driver(request, ms)
  local dir = os.getenv('XUM_TEST_SIGNALS')
  local f = assert(io.open(dir .. '/' .. request .. '.request', 'w'))
  f:write('1')
  f:close()
  T.wait_for(function()
    return uv.fs_stat(dir .. '/' .. request .. '.done') ~= nil
  end, 'the driver to ' .. request, ms or 60000)
end

function T.realpath(p)
  return uv.fs_realpath(p) or p
end

_G.T = T
local name = os.getenv('XUM_NVIM_SCENARIO')
local scenarios = dofile(os.getenv('XUM_NVIM_SCENARIOS'))
local scenario = scenarios[name]
local ok, err = xpcall(function()
  if not scenario then
    error('no scenario ' .. tostring(name))
  end
  scenario(T)
end, debug.traceback)
if ok then
  out('PASSED ' .. name)
  vim.cmd('qall!')
else
  out('FAILED ' .. tostring(name) .. ': ' .. tostring(err))
  vim.cmd('cquit 1')
end
