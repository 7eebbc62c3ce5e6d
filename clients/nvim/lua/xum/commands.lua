-- :Xum <subcommand> ... — the user commands, their completion, and the pickers.
local client = require('xum.client')
local state = require('xum.state')
local util = require('xum.util')

local M = {}

-- terminals this plugin opened, by workspace id: { {job=, buf=, lease=} ... }
M.terminals = {}

-- Workspaces whose setup this editor waits for (a create, an unarchive): their setup steps
-- are shown as they start. Keyed by project_id .. '/' .. name.
local awaiting_setup = {}

table.insert(state.listeners, function(ev)
  if ev.type ~= 'script.started' or type(ev.data) ~= 'table' then
    return
  end
  local d = ev.data
  if not awaiting_setup[tostring(d.project_id) .. '/' .. tostring(d.name)] then
    return
  end
  local step = tonumber(d.index) or 0 -- from 1
  vim.notify(string.format('xum: %s setup %d/%s: %s', util.printable(d.name or '?'), step, tostring(d.count or '?'), util.printable(d.command or '')), vim.log.levels.INFO, { title = 'xum' })
end)

local INFO, WARN, ERROR = vim.log.levels.INFO, vim.log.levels.WARN, vim.log.levels.ERROR

local function notify(msg, level)
  vim.notify(msg, level or INFO, { title = 'xum' })
end

local function fail(err, what)
  notify(util.format_error(err, what), ERROR)
end

local function usage(msg)
  fail({ message = msg, data = { kind = 'usage' } })
end

local function xum()
  return require('xum')
end

-- Fetch projects and workspaces fresh (the cache may lag a change made a moment ago).
local function listing(cb)
  client.request('project.list', {}, function(perr, presult)
    if perr then
      return cb(perr)
    end
    -- page by page: one answer for a root of tens of thousands would pass the frame cap
    client.list_workspaces({}, function(werr, listed)
      if werr then
        return cb(werr)
      end
      local projects = state.index(presult.projects)
      local workspaces = {}
      for _, ws in ipairs(listed) do
        if type(ws) == 'table' and type(ws.id) == 'string' and type(ws.name) == 'string' and type(ws.path) == 'string' then
          workspaces[#workspaces + 1] = ws
        end
      end
      cb(nil, projects, workspaces)
    end)
  end)
end

local function not_found(message)
  return { code = -32001, message = message, data = { kind = 'not_found' } }
end

-- The project a directory belongs to: the workspace it is in, else the repository it is in
-- (the deepest match either way).
local function project_of(dir, projects, workspaces)
  local ws = util.deepest_holding(dir, workspaces)
  if ws then
    return projects[ws.project_id]
  end
  return util.deepest_holding(dir, projects)
end

-- What the user typed (ws_<id>, PROJECT/NAME, or NAME) -> the workspace. A bare NAME is
-- looked for in the current directory's project first, then everywhere; two matches are an
-- error naming both (never a guess).
local function pick(ref, projects, workspaces)
  if ref:sub(1, 3) == 'ws_' then
    for _, ws in ipairs(workspaces) do
      if ws.id == ref then
        return ws
      end
    end
    return nil, not_found('no workspace ' .. ref)
  end
  local project, name = ref:match('^(.*)/([^/]+)$')
  local matches = {}
  for _, ws in ipairs(workspaces) do
    local p = projects[ws.project_id] or {}
    if project then
      if ws.name == name and (p.name == project or p.id == project) then
        matches[#matches + 1] = ws
      end
    elseif ws.name == ref then
      matches[#matches + 1] = ws
    end
  end
  if #matches > 1 then
    local here = project_of(xum().cwd(), projects, workspaces)
    local local_matches = {}
    for _, ws in ipairs(matches) do
      if here and ws.project_id == here.id then
        local_matches[#local_matches + 1] = ws
      end
    end
    if #local_matches == 1 then
      return local_matches[1]
    end
    local names = {}
    for _, ws in ipairs(matches) do
      names[#names + 1] = ((projects[ws.project_id] or {}).name or ws.project_id) .. '/' .. ws.name
    end
    return nil, not_found(ref .. ' is ambiguous: ' .. table.concat(names, ', ') .. ' (give PROJECT/NAME)')
  end
  if #matches == 0 then
    return nil, not_found('no workspace ' .. ref)
  end
  return matches[1]
end

-- cb(ws, projects): the workspace named by `ref`, or the one the current directory is in;
-- with `pick_state` and neither, one picked among those in that state.
local function resolve(ref, cb, pick_state)
  listing(function(err, projects, workspaces)
    if err then
      return fail(err)
    end
    if ref == nil or ref == '' then
      local best = util.deepest_holding(xum().cwd(), workspaces)
      if best then
        return cb(best, projects)
      end
      local choices = vim.tbl_filter(function(ws)
        return ws.state == pick_state
      end, workspaces)
      if not pick_state or #choices == 0 then
        return fail(not_found('the current directory is in no workspace: name one'))
      end
      table.sort(choices, function(a, b)
        return a.name < b.name
      end)
      vim.ui.select(choices, {
        prompt = 'xum: which workspace',
        kind = 'xum_workspace',
        format_item = function(ws)
          return ((projects[ws.project_id] or {}).name or '?') .. '/' .. ws.name .. '  ' .. ws.path
        end,
      }, function(choice)
        if choice then
          cb(choice, projects)
        end
      end)
      return
    end
    local ws, perr = pick(ref, projects, workspaces)
    if not ws then
      return fail(perr)
    end
    cb(ws, projects)
  end)
end

local function cleanup_text(cleanup)
  if type(cleanup) ~= 'table' then
    return 'cleanup: unknown'
  end
  local text = 'cleanup: ' .. tostring(cleanup.status)
  if cleanup.status == 'pending' then
    local attempts = tonumber(cleanup.attempts) or 0
    text = text .. ' (' .. attempts .. ' attempt' .. (attempts == 1 and '' or 's')
    local at = tonumber(cleanup.next_attempt_at)
    if at then
      text = text .. ', next in ' .. math.max(0, math.floor(at - os.time() + 0.5)) .. ' s'
    end
    text = text .. ')'
  end
  -- the last error keeps a teardown's output tail: whatever a script printed
  local why = cleanup.last_error or cleanup.reason
  if why then
    text = text .. ': ' .. util.printable(why)
  end
  local reclaim = cleanup.reclaim
  if type(reclaim) == 'table' and reclaim.status and reclaim.status ~= 'not_needed' then
    text = text .. '; reclaim ' .. tostring(reclaim.status)
  end
  return text
end
M.cleanup_text = cleanup_text

-- What the setup of a create or unarchive did, for the message ('' when there was none),
-- and the level to show the message at (a failed setup warns).
local function setup_text(setup)
  setup = type(setup) == 'table' and setup or {}
  if not setup.status or setup.status == 'none' then
    return '', INFO
  end
  local text = '; setup: ' .. tostring(setup.status)
  if setup.hint then
    text = text .. ' (' .. tostring(setup.hint) .. ')'
  end
  return text, (setup.status == 'failed' or setup.status == 'timeout') and WARN or INFO
end

local function project_dir(ws, projects)
  local p = projects and projects[ws.project_id] or state.projects[ws.project_id]
  return (p and p.path) or vim.fn.expand('~')
end

-- A checkout about to be archived or removed must not hold our own cwd: the daemon counts
-- a process whose cwd is inside as a holder (busy), and the directory is going away.
local function step_out(ws, projects)
  local root = util.uv.fs_realpath(ws.path) or ws.path
  local function inside(dir)
    return util.is_within(util.uv.fs_realpath(dir) or dir, root)
  end
  local target = vim.fn.fnameescape(project_dir(ws, projects))
  local moved = false
  -- The global directory first: `:cd` also clears the current window's and tab's local
  -- directories, so those are put back (and then checked like every other).
  if inside(vim.fn.getcwd(-1, -1)) then
    local win_dir = vim.fn.haslocaldir() == 1 and vim.fn.getcwd() or nil
    local tab_dir = vim.fn.haslocaldir(-1, 0) == 1 and vim.fn.getcwd(-1, 0) or nil
    vim.cmd('cd ' .. target)
    if tab_dir then
      vim.cmd('tcd ' .. vim.fn.fnameescape(tab_dir))
    end
    if win_dir then
      vim.cmd('lcd ' .. vim.fn.fnameescape(win_dir))
    end
    moved = true
  end
  -- Then every tab's and window's own directory (entering it would chdir back in). Each is
  -- visited for real (nvim_win_call does not keep a :tcd), with autocommands off, and the
  -- current window is restored after. `:tcd` also clears the window's own directory: one
  -- outside the checkout is put back.
  local home = vim.api.nvim_get_current_win()
  local eventignore = vim.o.eventignore
  vim.o.eventignore = 'all'
  local ok, err = pcall(function()
    for _, tab in ipairs(vim.api.nvim_list_tabpages()) do
      vim.api.nvim_set_current_tabpage(tab)
      if vim.fn.haslocaldir(-1, 0) == 1 and inside(vim.fn.getcwd(-1, 0)) then
        local win_dir = vim.fn.haslocaldir() == 1 and vim.fn.getcwd() or nil
        vim.cmd('tcd ' .. target)
        if win_dir and not inside(win_dir) then
          vim.cmd('lcd ' .. vim.fn.fnameescape(win_dir))
        end
        moved = true
      end
      for _, win in ipairs(vim.api.nvim_tabpage_list_wins(tab)) do
        vim.api.nvim_set_current_win(win)
        if vim.fn.haslocaldir() == 1 and inside(vim.fn.getcwd()) then
          vim.cmd('lcd ' .. target)
          moved = true
        end
      end
    end
  end)
  pcall(vim.api.nvim_set_current_win, home)
  vim.o.eventignore = eventignore
  if not ok then
    error(err)
  end
  if moved then
    notify('xum: left ' .. ws.path .. ' for ' .. project_dir(ws, projects))
  end
end

-- Stop the plugin's own terminals in a workspace and wait (bounded) until they are gone:
-- jobstop only asks, and a shell still there when the daemon looks would make it busy.
local function stop_terminals(ws_id)
  local jobs = {}
  for _, term in ipairs(M.terminals[ws_id] or {}) do
    if term.job and pcall(vim.fn.jobstop, term.job) then
      jobs[#jobs + 1] = term.job
    end
  end
  if #jobs > 0 then
    vim.fn.jobwait(jobs, 3000)
  end
end

-- Buffers with unsaved changes to files in a checkout: the daemon snapshots what is on
-- disk, so an archive or removal would leave these changes with nowhere to go.
local function unsaved_in(ws)
  local root = util.uv.fs_realpath(ws.path) or ws.path
  local names = {}
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(buf) and vim.bo[buf].modified and vim.bo[buf].buftype == '' then
      local name = vim.api.nvim_buf_get_name(buf)
      if name ~= '' then
        local dir = util.uv.fs_realpath(vim.fn.fnamemodify(name, ':h')) or vim.fn.fnamemodify(name, ':h')
        local full = dir .. '/' .. vim.fn.fnamemodify(name, ':t')
        if util.is_within(full, root) then
          names[#names + 1] = full:sub(#root + 2)
        end
      end
    end
  end
  table.sort(names)
  return names
end

-- Refuse (not_safe) when unsaved buffers would be orphaned, unless told to go on.
local function refuse_unsaved(ws, what, ignore)
  if ignore then
    return false
  end
  local names = unsaved_in(ws)
  if #names == 0 then
    return false
  end
  fail({
    message = 'unsaved changes in ' .. #names .. ' buffer(s): ' .. table.concat(names, ', ')
      .. ' (write them first, or add --ignore-unsaved)',
    data = { kind = 'not_safe' },
  }, what .. ' ' .. ws.name)
  return true
end

-- After the flags were taken: an unknown option or an extra argument is a usage error
-- (a typo must not be taken for a workspace name).
local function bad_args(args, max, synopsis)
  for _, a in ipairs(args) do
    if a:sub(1, 1) == '-' then
      usage('unknown option ' .. a .. ' (' .. synopsis .. ')')
      return true
    end
  end
  if #args > max then
    usage('too many arguments (' .. synopsis .. ')')
    return true
  end
  return false
end

local function flag(args, name)
  for i, a in ipairs(args) do
    if a == name then
      table.remove(args, i)
      return true
    end
  end
  return false
end

-- :Xum new [PROJECT/]NAME — in the current directory's project (or the only one, or asked).
function M.new(args)
  if bad_args(args, 1, ':Xum new [PROJECT/]NAME') then
    return
  end
  local ref = args[1]
  if not ref then
    return usage('usage: :Xum new [PROJECT/]NAME')
  end
  local project_ref, name = ref:match('^(.*)/([^/]+)$')
  name = name or ref
  listing(function(err, projects, workspaces)
    if err then
      return fail(err)
    end
    local function create(project)
      notify('xum: creating ' .. project.name .. '/' .. name .. ' ...')
      local key = project.id .. '/' .. name
      awaiting_setup[key] = true
      client.request('workspace.create', { project_id = project.id, name = name }, function(cerr, result)
        awaiting_setup[key] = nil
        if cerr then
          return fail(cerr, 'new ' .. name)
        end
        local ws = result.workspace
        local setup, level = setup_text(result.setup)
        notify('xum: created ' .. project.name .. '/' .. ws.name .. ' at ' .. ws.path .. setup, level)
      end)
    end
    local list = {}
    for _, p in pairs(projects) do
      list[#list + 1] = p
    end
    table.sort(list, function(a, b)
      return a.name < b.name
    end)
    if project_ref then
      for _, p in ipairs(list) do
        if p.name == project_ref or p.id == project_ref then
          return create(p)
        end
      end
      return fail(not_found('no project ' .. project_ref))
    end
    local best = project_of(xum().cwd(), projects, workspaces)
    if best then
      return create(best)
    end
    if #list == 1 then
      return create(list[1])
    end
    if #list == 0 then
      return fail(not_found('no project yet: add one with `xum project add PATH`'))
    end
    vim.ui.select(list, {
      prompt = 'xum: project for ' .. name,
      format_item = function(p)
        return p.name .. '  ' .. p.path
      end,
    }, function(choice)
      if choice then
        create(choice)
      end
    end)
  end)
end

-- Only an active workspace has a checkout to go to: refused (invalid_state) otherwise.
local function refuse_inactive(ws)
  if ws.state == 'active' then
    return false
  end
  local hint = ws.state == 'archived' and ' (unarchive it first)' or ''
  fail({ message = ws.name .. ' is ' .. tostring(ws.state) .. ', not active' .. hint, data = { kind = 'invalid_state' } })
  return true
end

-- :Xum open [REF] — :tcd into the checkout.
function M.open(args)
  if bad_args(args, 1, ':Xum open [REF]') then
    return
  end
  resolve(args[1], function(ws)
    if refuse_inactive(ws) then
      return
    end
    vim.cmd('tcd ' .. vim.fn.fnameescape(ws.path))
    notify('xum: ' .. ws.name .. ' (' .. ws.path .. ')')
  end, 'active')
end

-- :Xum term [REF] — a terminal in the checkout, held by a lease so an archive names it.
function M.term(args)
  if bad_args(args, 1, ':Xum term [REF]') then
    return
  end
  resolve(args[1], function(ws)
    if refuse_inactive(ws) then
      return
    end
    -- 'shell' as an argv (a string would run through the shell itself, which then fails in
    -- the terminal instead of here)
    local argv = vim.split(vim.o.shell, '%s+', { trimempty = true })
    if #argv == 0 or vim.fn.executable(argv[1]) ~= 1 then
      return fail({ message = 'could not start ' .. vim.o.shell .. ': not an executable (\'shell\')', data = { kind = 'operation_failed' } })
    end
    vim.cmd('botright new')
    local buf = vim.api.nvim_get_current_buf()
    local entry = { buf = buf }
    -- termopen() until 0.10; jobstart{ term = true } from 0.11, where termopen is deprecated
    local open_term = vim.fn.has('nvim-0.11') == 1 and function(cmd, opts)
      opts.term = true
      return vim.fn.jobstart(cmd, opts)
    end or vim.fn.termopen
    local job = open_term(argv, {
      cwd = ws.path,
      env = { XUM_WORKSPACE = ws.name, XUM_WORKSPACE_ID = ws.id },
      on_exit = function()
        if entry.lease then
          client.request('lease.release', { lease_id = entry.lease }, function() end)
        end
        local list = M.terminals[ws.id] or {}
        for i, t in ipairs(list) do
          if t == entry then
            table.remove(list, i)
            break
          end
        end
      end,
    })
    if job <= 0 then
      return fail({ message = 'could not start ' .. vim.o.shell, data = { kind = 'operation_failed' } })
    end
    entry.job = job
    M.terminals[ws.id] = M.terminals[ws.id] or {}
    table.insert(M.terminals[ws.id], entry)
    pcall(vim.api.nvim_buf_set_name, buf, 'xum://' .. ws.name .. '/term/' .. job)
    local pid = vim.fn.jobpid(job)
    client.request('lease.acquire', { workspace_id = ws.id, kind = 'terminal', pid = pid, label = 'nvim terminal' }, function(err, result)
      if err then
        return fail(err, 'lease for the terminal')
      end
      entry.lease = result.lease and result.lease.id
    end)
  end, 'active')
end

-- The start of a command that takes a checkout away (archive, rm; its own flags already
-- taken): the workspace, refused while buffers in it are unsaved (unless --ignore-unsaved),
-- and this editor's directories moved out of it; then cb(ws).
local function leaving(args, verb, synopsis, cb)
  local ignore_unsaved = flag(args, '--ignore-unsaved')
  if bad_args(args, 1, synopsis) then
    return
  end
  resolve(args[1], function(ws, projects)
    if refuse_unsaved(ws, verb, ignore_unsaved) then
      return
    end
    step_out(ws, projects)
    cb(ws)
  end)
end

-- :Xum archive [REF] [--stop] — snapshot, archive, and say what the cleanup did.
function M.archive(args)
  local stop = flag(args, '--stop')
  leaving(args, 'archive', ':Xum archive [REF] [--stop] [--ignore-unsaved]', function(ws)
    if stop then
      stop_terminals(ws.id)
    end
    notify('xum: archiving ' .. ws.name .. ' ...')
    client.request('workspace.archive', { workspace_id = ws.id, stop = stop }, function(err, result)
      if err then
        return fail(err, 'archive ' .. ws.name)
      end
      local msg = 'xum: archived ' .. ws.name
      local snap = result.snapshot
      if type(snap) == 'table' and snap.commit then
        msg = msg .. ' (snapshot ' .. tostring(snap.commit):sub(1, 12) .. ')'
      end
      msg = msg .. '; ' .. cleanup_text(result.cleanup)
      local dropped = result.dropped
      if type(dropped) == 'table' and (tonumber(dropped.count) or 0) > 0 then
        msg = msg .. '; dropped ' .. dropped.count .. ' ignored file(s)'
      end
      local status = type(result.cleanup) == 'table' and result.cleanup.status
      notify(msg, (status == 'pending' or status == 'failed') and WARN or INFO)
    end)
  end)
end

-- :Xum unarchive REF
function M.unarchive(args)
  if bad_args(args, 1, ':Xum unarchive REF') then
    return
  end
  resolve(args[1], function(ws)
    notify('xum: restoring ' .. ws.name .. ' ...')
    local key = ws.project_id .. '/' .. ws.name
    awaiting_setup[key] = true
    client.request('workspace.unarchive', { workspace_id = ws.id }, function(err, result)
      awaiting_setup[key] = nil
      if err then
        return fail(err, 'unarchive ' .. ws.name)
      end
      local setup, level = setup_text(result.setup)
      local msg = 'xum: restored ' .. ws.name .. ' at ' .. result.workspace.path .. setup
      local restored = result.restored or {}
      if restored.kept_at then
        msg = msg .. '; some preserved files were not verified, kept at ' .. tostring(restored.kept_at)
      end
      notify(msg, level)
    end)
  end)
end

-- :Xum rm REF [--force]
function M.rm(args)
  local force = flag(args, '--force')
  leaving(args, 'rm', ':Xum rm REF [--force] [--ignore-unsaved]', function(ws)
    client.request('workspace.remove', { workspace_id = ws.id, force = force }, function(err, result)
      if err then
        return fail(err, 'rm ' .. ws.name)
      end
      local msg = 'xum: removed ' .. ws.name .. '; ' .. cleanup_text(result.cleanup)
      if type(result.kept) == 'table' and result.kept.path then
        msg = msg .. '; preserved files kept at ' .. tostring(result.kept.path)
      end
      if result.branch then
        msg = msg .. '; branch ' .. tostring(result.branch) .. ' kept'
      end
      notify(msg)
    end)
  end)
end

local ACTIONS = {
  active = { 'open', 'term', 'archive', 'rm' },
  archived = { 'unarchive', 'rm' },
}

local function label(ws, projects)
  local p = projects[ws.project_id] or {}
  local text = string.format('%-24s %-9s %s', (p.name or '?') .. '/' .. ws.name, tostring(ws.state), tostring(ws.branch or '-'))
  local cleanup = ws.last_cleanup
  if type(cleanup) == 'table' and cleanup.status == 'pending' then
    text = text .. '  (cleanup pending)'
  end
  if ws.interrupted then
    text = text .. '  (interrupted)'
  end
  return text
end

-- :Xum ls — pick a workspace, then what to do with it.
function M.ls()
  listing(function(err, projects, workspaces)
    if err then
      return fail(err)
    end
    if #workspaces == 0 then
      return notify('xum: no workspaces')
    end
    table.sort(workspaces, function(a, b)
      return label(a, projects) < label(b, projects)
    end)
    vim.ui.select(workspaces, {
      prompt = 'xum workspaces',
      kind = 'xum_workspace',
      format_item = function(ws)
        return label(ws, projects)
      end,
    }, function(ws)
      if not ws then
        return
      end
      local actions = ACTIONS[ws.state]
      if not actions then
        return notify('xum: ' .. ws.name .. ' is ' .. tostring(ws.state))
      end
      vim.ui.select(actions, { prompt = 'xum: ' .. ws.name }, function(action)
        if action then
          M[action]({ ws.id })
        end
      end)
    end)
  end)
end

-- :Xum status — the connection, as :checkhealth would say it briefly.
function M.status()
  local path, source = client.socket_path()
  local msg = 'xum: ' .. client.status .. ' (' .. path .. ', ' .. source .. ')'
  if client.hello then
    msg = msg .. '; protocol ' .. tostring(client.hello.protocol)
  end
  if client.last_error then
    msg = msg .. '; last error: ' .. tostring(client.last_error)
  end
  notify(msg)
end

M.SUBCOMMANDS = { 'archive', 'ls', 'new', 'open', 'rm', 'status', 'term', 'unarchive' }

-- Which workspaces each subcommand completes.
local COMPLETE_STATES = {
  open = { active = true },
  term = { active = true },
  archive = { active = true },
  unarchive = { archived = true },
  rm = { active = true, archived = true },
}

local FLAGS = { archive = { '--ignore-unsaved', '--stop' }, rm = { '--force', '--ignore-unsaved' } }

-- Workspace names for completion: NAME, or PROJECT/NAME where a name is in two projects.
function M.workspace_names(states)
  if not state.loaded and client.status ~= 'offline' then
    -- Not subscribed yet: ask, both at once and within one short budget (completion must
    -- not hang the command line; a daemon known to be down is not asked at all).
    local result, presult
    local waiting = 2
    client.list_workspaces({}, function(_, listed)
      result, waiting = listed and { workspaces = listed }, waiting - 1
    end, 1000)
    client.request('project.list', {}, function(_, r)
      presult, waiting = r, waiting - 1
    end, 1000)
    vim.wait(1500, function()
      return waiting == 0
    end, 10)
    -- the subscription may have loaded the cache meanwhile: it is newer than these
    if result and presult and not state.loaded then
      for _, ws in ipairs(result.workspaces or {}) do
        if type(ws) == 'table' and type(ws.id) == 'string' and type(ws.name) == 'string' then
          state.workspaces[ws.id] = ws
        end
      end
      for id, p in pairs(state.index(presult.projects)) do
        state.projects[id] = p
      end
    end
  end
  local count = {}
  for _, ws in pairs(state.workspaces) do
    count[ws.name] = (count[ws.name] or 0) + 1
  end
  local names = {}
  for _, ws in pairs(state.workspaces) do
    if not states or states[ws.state] then
      if count[ws.name] > 1 then
        local p = state.projects[ws.project_id]
        names[#names + 1] = ((p and p.name) or ws.project_id) .. '/' .. ws.name
      else
        names[#names + 1] = ws.name
      end
    end
  end
  table.sort(names)
  return names
end

local function starting_with(list, prefix)
  return vim.tbl_filter(function(item)
    return item:sub(1, #prefix) == prefix
  end, list)
end

function M.complete(arglead, cmdline, _)
  local words = vim.split(cmdline:gsub('^%s*%S+%s*', ''), '%s+', { trimempty = false })
  if #words <= 1 then
    return starting_with(M.SUBCOMMANDS, arglead)
  end
  local sub = words[1]
  local candidates = {}
  if COMPLETE_STATES[sub] then
    candidates = M.workspace_names(COMPLETE_STATES[sub])
  elseif sub == 'new' and #words == 2 then
    -- a new name is the user's; the project it goes in can be completed
    M.workspace_names(nil)
    for _, p in pairs(state.projects) do
      candidates[#candidates + 1] = p.name .. '/'
    end
    table.sort(candidates)
  end
  vim.list_extend(candidates, FLAGS[sub] or {})
  return starting_with(candidates, arglead)
end

function M.run(opts)
  local args = vim.deepcopy(opts.fargs)
  local sub = table.remove(args, 1)
  if not sub then
    return M.ls()
  end
  local fn = M[sub]
  if not vim.tbl_contains(M.SUBCOMMANDS, sub) or type(fn) ~= 'function' then
    return usage('unknown subcommand ' .. sub .. ' (one of: ' .. table.concat(M.SUBCOMMANDS, ', ') .. ')')
  end
  fn(args)
end

return M
