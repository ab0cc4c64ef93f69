-- Loaded by HAProxy for spec/host_haproxy_spec.lua: a call in an init
-- function, which HAProxy runs before it serves.
-- luacheck: read globals core
local rw = require "ratewise"
core.register_init(function()
  rw.fetch(os.getenv("RW_BASE") .. "/rh/ping")
end)
