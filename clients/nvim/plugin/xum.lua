-- xum.nvim: the :Xum command. Nothing connects until it is used (or the statusline asks).
if vim.g.loaded_xum then
  return
end
vim.g.loaded_xum = true

if vim.fn.has('nvim-0.7') == 0 then
  vim.notify('xum.nvim needs Neovim 0.7 or later', vim.log.levels.ERROR)
  return
end

vim.api.nvim_create_user_command('Xum', function(opts)
  require('xum.commands').run(opts)
end, {
  nargs = '*',
  desc = 'xum workspaces: new, ls, open, term, archive, unarchive, rm, status',
  complete = function(arglead, cmdline, pos)
    return require('xum.commands').complete(arglead, cmdline, pos)
  end,
})
