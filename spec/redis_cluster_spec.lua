-- rw.redis_bucket on a Redis Cluster of three primaries and their replicas
-- the suite starts on loopback (spec/support/redis_ha.lua): the bucket's key
-- goes to the node of its slot, and a slot that moves is followed (ASK while
-- it migrates, MOVED once it has, a replica promoted when its primary
-- fails), as hiredis-cluster and redis-py follow them.
local rw = require "ratewise"
local ha = require "spec.support.redis_ha"
local topology = require "ratewise.redis_topology"

local test, runs = ha.test(it, pending, rw.features.redis)

describe("rw.redis_bucket on a Redis Cluster", function()
  local c

  setup(function()
    if runs then c = ha.cluster { replicas = 1 } end
  end)
  teardown(function()
    if c then c:destroy() end
  end)

  it("hashes a key to its slot as Redis does (CRC16 of its hash tag)", function()
    for _, key in ipairs { "foo", "123456789", "ratewise:{shared}", "{user1000}.following", "a{}b", "{}{x}", "" } do
      local expected = c and tonumber(c.nodes[1]:cli("CLUSTER", "KEYSLOT", key))
      if expected then assert.equal(expected, topology.key_slot(key), key) end
    end
    assert.equal(12182, topology.key_slot("foo"))
    assert.equal(topology.key_slot("shared"), topology.key_slot("ratewise:{shared}"))
  end)

  test("sends the bucket's script to the node of its key, from any node it is given", function()
    local key = "ratewise:{routed}"
    local owner = c:owner(key)
    local seed
    for _, node in ipairs(c:primaries()) do
      if node ~= owner then seed = node end
    end
    local b = rw.redis_bucket { redis = { cluster = { "127.0.0.1:" .. seed.port } }, key = "routed",
      capacity = 5, rate = 1 }
    assert.is_true((b:take()))
    assert.is_true((b:take()))
    assert.equal("1", owner:cli("EXISTS", key))
    local _, rejected = c.calls(seed, "evalsha")
    assert.equal(0, rejected)
    b:close()
  end)

  test("follows ASK while its slot migrates and MOVED once it has, then reads the slot map again", function()
    local name = "moving"
    local key = "ratewise:{" .. name .. "}"
    local slot = topology.key_slot(key)
    local source = c:owner(key)
    local target
    local primaries = c:primaries()
    for _, node in ipairs(primaries) do
      if node ~= source then target = node end
    end
    local seeds = {}
    for i, node in ipairs(c.nodes) do seeds[i] = "127.0.0.1:" .. node.port end
    local b = rw.redis_bucket { redis = { cluster = seeds }, key = name, capacity = 5, rate = 1 }
    assert.is_true((b:take()))

    -- Migrating: the key moved to the target, the slot still the source's.
    local source_id, target_id = c.node_id(source), c.node_id(target)
    assert.equal("OK", target:cli("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id))
    assert.equal("OK", source:cli("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id))
    assert.equal("OK", source:cli("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key))
    local _, asked_before = c.calls(source, "evalsha")
    local ok, err = b:take()
    assert.is_true(ok, err and err.message)
    local _, asked = c.calls(source, "evalsha")
    assert.equal(asked_before + 1, asked)   -- ASK
    -- the token came off the state the migration carried: 3 of 5 left
    assert.equal("1", target:cli("CLUSTER", "COUNTKEYSINSLOT", slot))
    local tokens = assert(b:tokens())
    assert.is_true(tokens >= 3 and tokens < 3.5, tostring(tokens))

    -- Migrated: every node says the slot is the target's.
    for _, node in ipairs(primaries) do
      assert.equal("OK", node:cli("CLUSTER", "SETSLOT", slot, "NODE", target_id))
    end
    _, asked = c.calls(source, "evalsha")   -- tokens() was asked too
    local maps_before = 0
    for _, node in ipairs(c.nodes) do maps_before = maps_before + c.calls(node, "cluster|slots") end
    ok, err = b:take()
    assert.is_true(ok, err and err.message)
    local _, moved = c.calls(source, "evalsha")
    assert.equal(asked + 1, moved)   -- MOVED, followed to the target
    -- the next command reads the map again, and goes to the target at once
    ok = b:take()
    assert.is_not_nil(ok)
    local maps = 0
    for _, node in ipairs(c.nodes) do maps = maps + c.calls(node, "cluster|slots") end
    assert.equal(maps_before + 1, maps)
    local _, after = c.calls(source, "evalsha")
    assert.equal(moved, after)
    b:close()
  end)

  -- Last: it leaves the cluster a primary short.
  test("finds the replica promoted when the primary of its slot fails, each call within its timeout", function()
    local key = "ratewise:{failover}"
    local b = rw.redis_bucket { redis = { cluster = { "127.0.0.1:" .. c.nodes[1].port } }, key = "failover",
      capacity = 100, rate = 100, timeout = 0.25 }
    assert.is_true((b:take()))
    local owner = c:owner(key)
    owner:stop()
    local stopped = rw.now()
    local back, failures, slowest, kinds = ha.until_admitted(b, stopped)
    assert.is_truthy(back, "the bucket admitted nothing for 15 s after the primary of its slot stopped")
    -- cluster-node-timeout 1000, then the replicas' election
    assert.is_true(back < 8, string.format("admitting again %.2f s after the primary stopped", back))
    assert.is_true(failures > 0)
    assert.same({ limiter_unavailable = true }, kinds)
    assert.is_true(slowest < 0.25 + 0.1, string.format("a call took %.3f s against a timeout of 0.25 s", slowest))
    local promoted = c:owner(key)
    assert.is_truthy(promoted)
    assert.are_not.equal(owner, promoted)
    assert.equal("1", promoted:cli("EXISTS", key))
    b:close()
  end)
end)
