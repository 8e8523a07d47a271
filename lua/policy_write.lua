#!lua
-- policy_write.lua: every change to the policy set, atomically, with the metadata that lets each
-- instance follow the changes in order and notice when Redis has lost its data.
--
-- The shebang declares the script to Redis 7: a flagged script that may write is refused whole
-- while Redis is out of memory, so no write is ever half done.
--
-- KEYS[1]  <prefix>:{policies}:meta     hash: generation (a random id chosen by the first writer,
--                                       gone when Redis loses its data), version (bumped by every
--                                       change), floor (deletions at or below it are forgotten)
-- KEYS[2]  <prefix>:{policies}:names    sorted set: live policy name -> version of its last write
-- KEYS[3]  <prefix>:{policies}:deleted  sorted set: deleted name -> version of its deletion; the
--                                       newest MAX_DELETED are kept
-- KEYS[4]  <prefix>:{policies}:seeded   set: names the configuration file has created once
-- KEYS[5]  <prefix>:{policies}:policy:<name>  hash: the policy's fields (its JSON document in
--                                       `doc`), and `born`: the version of the write that created
--                                       the policy, kept by every replacement (absent in a hash
--                                       written before policies had it, and then kept absent)
-- KEYS[6]  <prefix>:{policies}:index    set of names written by versions before the change log;
-- KEYS[7]  <prefix>:{policies}:version  and their counter: adopted, then deleted, by the write
--                                       that gives the store its generation
-- KEYS[8]  <prefix>:{policies}:shapes   hash: Envoy descriptor shape -> the policy that claims it,
--                                       so that two writers racing for one shape cannot both win
-- KEYS[9]  <prefix>:{policies}:overrides:<name>       the policy's overrides, and the ids of
-- KEYS[10] <prefix>:{policies}:matches:<name>:exact   their matches (see override_write.lua):
-- KEYS[11] <prefix>:{policies}:matches:<name>:pattern deleted with the policy, or when a write
--                                       changes its kind; `overrides` in meta counts the live
--                                       overrides, whose log entries share `names` with policies
-- ARGV[1]  'create' (only when absent), 'put' (create or replace), 'delete', 'seed' (create
--          unless present or ever seeded before), or 'probe' (change nothing)
-- ARGV[2]  the policy's name
-- ARGV[3]  the precondition: '' none, '*' the policy must not exist, '+' it must exist,
--          '<generation>.<version>' it must exist at exactly that version (an ETag)
-- ARGV[4]  the most policies the store may hold
-- ARGV[5]  a fresh random generation id, used only if the store has none yet
-- ARGV[6]  create, put and seed: the written policy's descriptor shape, '' when it serves none
-- ARGV[7]  create, put and seed: its kind, 'rate' or 'concurrency'
-- ARGV[8]  the shape and kind the writer last saw the policy have ('' none or unknown), read only
-- ARGV[9]  for a hash written before hashes kept their own `shape` and `kind` fields
-- ARGV[10…] create, put and seed: the hash's field, value pairs (never `born`, `shape` or `kind`:
--          the script keeps those)
-- Reply    {status, generation, version, born, owner}: status is one of created, replaced,
--          deleted, exists, missing, full, claimed, precondition_failed, probed; version is the
--          version the change was given, or for a refusal the policy's current version (0 when
--          absent); born is the written policy's `born` (its incarnation): the new version when
--          the write created it or changed its kind, the one kept when it replaced it, 0 for a
--          replaced hash without one and for every other status; owner is, for `claimed`, the
--          live policy that already serves the shape, '' otherwise

local MAX_DELETED = 10000

local meta, names, deleted, seeded, hash = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local overrides = KEYS[9]
local shapes = KEYS[8]
local mode, name, precondition = ARGV[1], ARGV[2], ARGV[3]
local shape, kind = ARGV[6], ARGV[7]

local generation = redis.call('HGET', meta, 'generation')
if not generation then
  generation = ARGV[5]
  redis.call('HSET', meta, 'generation', generation)
  local adopted = 0
  for _, old in ipairs(redis.call('SMEMBERS', KEYS[6])) do
    adopted = adopted + 1
    redis.call('ZADD', names, adopted, old)
  end
  if adopted > 0 then
    redis.call('HSET', meta, 'version', adopted)
  end
  redis.call('DEL', KEYS[6], KEYS[7])
end
if mode == 'probe' then
  return {'probed', generation, tonumber(redis.call('HGET', meta, 'version') or '0'), 0, ''}
end

local current = redis.call('ZSCORE', names, name)
if current then
  current = tonumber(current)
end
local refuse = function(status, owner)
  return {status, generation, current or 0, 0, owner or ''}
end

if precondition == '*' then
  if current then
    return refuse('precondition_failed')
  end
elseif precondition == '+' then
  if not current then
    return refuse('precondition_failed')
  end
elseif precondition ~= '' then
  if not current or precondition ~= generation .. '.' .. string.format('%d', current) then
    return refuse('precondition_failed')
  end
end

-- What the policy being replaced or deleted serves and is, from its hash, or for a hash written
-- before hashes kept them, as the writer last saw it.
local old_shape, old_kind = false, false
if current then
  local kept = redis.call('HMGET', hash, 'shape', 'kind')
  old_shape = kept[1] or ARGV[8]
  old_kind = kept[2] or ARGV[9]
end
-- Gives up the old shape's claim, when this policy holds it and no longer serves that shape.
local release = function(keeping)
  if old_shape and old_shape ~= '' and old_shape ~= keeping
      and redis.call('HGET', shapes, old_shape) == name then
    redis.call('HDEL', shapes, old_shape)
  end
end

-- Deletes the policy's overrides, their documents and their entries in the log (no deletion of
-- their own: an instance drops a policy's overrides when it applies the policy's deletion or
-- change of kind). At most the caps' worth of them, removed from `names` a thousand at a time.
local drop_overrides = function()
  local held = redis.call('HKEYS', overrides)
  if #held == 0 then
    return
  end
  local batch = {}
  for i, id in ipairs(held) do
    batch[#batch + 1] = name .. '/' .. id
    redis.call('DEL', hash .. '/' .. id)
    if #batch == 1000 or i == #held then
      redis.call('ZREM', names, unpack(batch))
      batch = {}
    end
  end
  redis.call('DEL', overrides, KEYS[10], KEYS[11])
  redis.call('HINCRBY', meta, 'overrides', -#held)
end

if mode == 'delete' then
  if not current then
    return refuse('missing')
  end
  release('')
  drop_overrides()
  redis.call('DEL', hash)
  redis.call('ZREM', names, name)
  local version = redis.call('HINCRBY', meta, 'version', 1)
  redis.call('ZADD', deleted, version, name)
  if redis.call('ZCARD', deleted) > MAX_DELETED then
    local oldest = redis.call('ZRANGE', deleted, 0, 0, 'WITHSCORES')
    redis.call('ZREMRANGEBYRANK', deleted, 0, 0)
    redis.call('HSET', meta, 'floor', oldest[2])
  end
  return {'deleted', generation, version, 0, ''}
end

if mode == 'seed' and (current or redis.call('SISMEMBER', seeded, name) == 1) then
  return refuse('exists')
elseif mode == 'create' and current then
  return refuse('exists')
end
local policies = redis.call('ZCARD', names) - tonumber(redis.call('HGET', meta, 'overrides') or '0')
if not current and policies >= tonumber(ARGV[4]) then
  return refuse('full')
end
-- A shape is claimed by the first policy written with it; a claim left by a policy that is gone,
-- or that serves another shape now, is stale and taken over. A policy keeping its own shape is
-- never refused.
if shape ~= '' and shape ~= old_shape then
  local owner = redis.call('HGET', shapes, shape)
  if owner and owner ~= name and redis.call('ZSCORE', names, owner) then
    local owner_shape = redis.call('HGET', string.sub(hash, 1, #hash - #name) .. owner, 'shape')
    if not owner_shape or owner_shape == shape then
      return refuse('claimed', owner)
    end
  end
end
if mode == 'seed' then
  redis.call('SADD', seeded, name)
end

-- A replacement keeps the incarnation of the policy it replaces, unless it changes the policy's
-- kind (a concurrency policy's leases must not outlive it as a rate policy and come back); a
-- creation's is its version.
local flipped = current and old_kind and old_kind ~= '' and old_kind ~= kind
local born = false
if current and not flipped then
  born = redis.call('HGET', hash, 'born')
end
if flipped then
  drop_overrides()
end
redis.call('DEL', hash)
redis.call('HSET', hash, 'kind', kind, unpack(ARGV, 10))
local version = redis.call('HINCRBY', meta, 'version', 1)
if not current or flipped then
  born = string.format('%d', version)
end
if born then
  redis.call('HSET', hash, 'born', born)
end
release(shape)
if shape ~= '' then
  redis.call('HSET', hash, 'shape', shape)
  redis.call('HSET', shapes, shape, name)
end
redis.call('ZADD', names, version, name)
redis.call('ZREM', deleted, name)
if current then
  return {'replaced', generation, version, tonumber(born or '0'), ''}
end
return {'created', generation, version, tonumber(born), ''}
