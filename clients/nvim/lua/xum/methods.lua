-- The protocol's mutating methods: their params accept a `request_key`, which the
-- client gives each call so that a call whose answer was lost is sent again safely.
-- Written from `xum_protocol.methods.METHODS` by `make schema`
-- (tests/protocol/test_method_table.py checks it is fresh): do not edit.
local M = {}

M.MUTATING = {
  ['project.add'] = true,
  ['project.remove'] = true,
  ['project.trust'] = true,
  ['workspace.create'] = true,
  ['workspace.reallocate_ports'] = true,
  ['workspace.rename'] = true,
  ['workspace.archive'] = true,
  ['workspace.unarchive'] = true,
  ['workspace.remove'] = true,
  ['workspace.setup'] = true,
  ['workspace.keep'] = true,
  ['gc.run'] = true,
  ['cleanup.retry'] = true,
  ['process.spawn'] = true,
  ['process.write'] = true,
  ['process.resize'] = true,
  ['process.signal'] = true,
  ['process.stop'] = true,
  ['process.background'] = true,
  ['process.release_all'] = true,
  ['lease.acquire'] = true,
  ['lease.release'] = true,
  ['turn.create'] = true,
  ['turn.end'] = true,
  ['workspace.discard_kept'] = true,
}

return M
