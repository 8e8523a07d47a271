#!lua
-- override_write.lua: one change to a policy's overrides, atomically with the change log that
-- policies follow (see policy_write.lua for the log's keys), the uniqueness of each match within
-- the policy, and the caps. Flagged, as policy_write.lua, so that it is refused whole while Redis
-- is out of memory.
--
-- An override is named in the log <policy>/<id> (no policy name holds `/`): a member of `names`
-- scored by the version of its last write while it lives, of `deleted` once deleted, like a
-- policy; its document is the `doc` field of the hash <prefix>:{policies}:policy:<policy>/<id>,
-- so that policy_read.lua reads both alike.
--
-- KEYS[1]  <prefix>:{policies}:meta      also `overrides`: how many overrides live, so that the
--                                        cap on policies counts policies only
-- KEYS[2]  <prefix>:{policies}:names
-- KEYS[3]  <prefix>:{policies}:deleted
-- KEYS[4]  <prefix>:{policies}:overrides:<policy>        hash: id -> the match's canonical text
-- KEYS[5]  <prefix>:{policies}:matches:<policy>:exact    hash: canonical match -> id, one per
-- KEYS[6]  <prefix>:{policies}:matches:<policy>:pattern  class (their lengths are the counts)
-- KEYS[7]  <prefix>:{policies}:policy:<policy>/<id>      hash: `doc`, the override's document
-- KEYS[8]  <prefix>:{policies}:policy:<policy>           the policy's hash (its `kind`)
-- ARGV[1]  'create', 'put' (replace an existing override) or 'delete'
-- ARGV[2]  the policy's name
-- ARGV[3]  the override's id
-- ARGV[4]  create, put: the version of the policy the override was checked against
-- ARGV[5]  the precondition on the override: '' none, '*' absent, '+' exists, or an ETag
--          '<generation>.<version>'
-- ARGV[6]  create, put: the match's canonical text (its class letter, `:`, its text)
-- ARGV[7]  create, put: its class, 'exact' or 'pattern'
-- ARGV[8]  create, put: the cap of that class
-- ARGV[9]  create, put: the override's document (JSON)
-- Reply    {status, generation, version, other}: status is one of created, replaced, deleted,
--          missing (no override of that id), exists (create: the id is taken), no_policy (the
--          policy is not a live rate policy), policy_changed (written since ARGV[4]), conflict
--          (another override has the match: other is its id), full (the class is at its cap),
--          precondition_failed; version is the change's, or for a refusal the override's
--          current version (0 when absent); other is '' unless conflict

local MAX_DELETED = 10000

local meta, names, deleted = KEYS[1], KEYS[2], KEYS[3]
local ids, doc_key, policy_hash = KEYS[4], KEYS[7], KEYS[8]
local op, policy, id, precondition = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local member = policy .. '/' .. id
local by_class = {exact = KEYS[5], pattern = KEYS[6]}

local generation = redis.call('HGET', meta, 'generation')
local current = redis.call('ZSCORE', names, member)
if current then
  current = tonumber(current)
end
local refuse = function(status, other)
  return {status, generation or '', current or 0, other or ''}
end

local policy_version = redis.call('ZSCORE', names, policy)
if not generation or not policy_version or redis.call('HGET', policy_hash, 'kind') == 'concurrency' then
  return refuse('no_policy')
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
if op == 'create' and current then
  return refuse('exists')
elseif op ~= 'create' and not current then
  return refuse('missing')
end

-- The old match, from the class whose hash holds it.
local old = redis.call('HGET', ids, id)
local old_class = false
if old then
  old_class = string.sub(old, 1, 1) == 'k' and 'exact' or 'pattern'
end

if op == 'delete' then
  if old then
    redis.call('HDEL', by_class[old_class], old)
  end
  redis.call('HDEL', ids, id)
  redis.call('DEL', doc_key)
  redis.call('ZREM', names, member)
  redis.call('HINCRBY', meta, 'overrides', -1)
  local version = redis.call('HINCRBY', meta, 'version', 1)
  redis.call('ZADD', deleted, version, member)
  if redis.call('ZCARD', deleted) > MAX_DELETED then
    local oldest = redis.call('ZRANGE', deleted, 0, 0, 'WITHSCORES')
    redis.call('ZREMRANGEBYRANK', deleted, 0, 0)
    redis.call('HSET', meta, 'floor', oldest[2])
  end
  return {'deleted', generation, version, ''}
end

if tonumber(policy_version) ~= tonumber(ARGV[4]) then
  return refuse('policy_changed')
end
local canonical, class, cap = ARGV[6], ARGV[7], tonumber(ARGV[8])
local matches = by_class[class]
local other = redis.call('HGET', matches, canonical)
if other and other ~= id then
  return refuse('conflict', other)
end
if old_class ~= class and redis.call('HLEN', matches) >= cap then
  return refuse('full')
end
if old then
  redis.call('HDEL', by_class[old_class], old)
end
redis.call('HSET', matches, canonical, id)
redis.call('HSET', ids, id, canonical)
redis.call('DEL', doc_key)
redis.call('HSET', doc_key, 'doc', ARGV[9])
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('ZADD', names, version, member)
redis.call('ZREM', deleted, member)
if current then
  return {'replaced', generation, version, ''}
end
redis.call('HINCRBY', meta, 'overrides', 1)
return {'created', generation, version, ''}
