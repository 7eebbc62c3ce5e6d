-- luacheck for the Neovim plugin and its test scenarios: `luacheck clients/nvim tests/nvim`
std = 'luajit'
globals = { 'vim' }
max_line_length = false
files['tests/nvim'] = { globals = { 'T' } }
