-- policy_write.lua: creates, replaces or deletes one policy together with the index of names
-- and the version counter, atomically, so that no reader sees half a write.
--
-- KEYS[1]  the policy's hash: <prefix>:{policies}:policy:<name>
-- KEYS[2]  the set of policy names: <prefix>:{policies}:index
-- KEYS[3]  the version counter, bumped on every change: <prefix>:{policies}:version
-- ARGV[1]  'create' (only when absent), 'put' (create or replace) or 'delete'
-- ARGV[2]  the policy's name
-- ARGV[3…] create and put: the hash's field, value pairs
-- Reply    create: 1 created, 0 already exists; put: 1 created, 2 replaced;
--          delete: 1 deleted, 0 no such policy

local mode = ARGV[1]
local exists = redis.call('EXISTS', KEYS[1]) == 1

if mode == 'delete' then
  if not exists then
    return 0
  end
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[2])
  redis.call('INCR', KEYS[3])
  return 1
end

if mode == 'create' and exists then
  return 0
end
if exists then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('INCR', KEYS[3])
if exists then
  return 2
end
return 1
