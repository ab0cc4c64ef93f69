-- Loaded by HAProxy for spec/host_haproxy_spec.lua: a call in the body of
-- the lua-load file, where HAProxy has not started serving.
local rw = require "ratewise"
rw.fetch(os.getenv("RW_BASE") .. "/rh/ping")
