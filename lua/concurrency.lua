-- concurrency.lua: one call on one subject's leases under a concurrency policy, keeping the
-- policy's ledger of every lease in step. Mirrors src/limiter/concurrency.rs (`decide`), whose
-- module doc states the rules. src/store/redis/scripts.rs makes two scripts of this file, split at the
-- line `--- look`/`--- change`: the head and the look section, flagged `no-writes` and called
-- with EVALSHA_RO (look), and the head and the change section (take, renew, release, sweep).
--
-- KEYS[1]  <prefix>:{<policy>@<incarnation>}:leases, the policy's ledger: a sorted set of every
--          lease of every subject, member string -> expiry in µs, the same as in its subject's
--          set. A call drops the leases whose expiry has passed (counting each once, as
--          `expired`) and answers the live ones' number (`leases`). It expires a minute
--          (LEDGER_GRACE_MS) after its last lease does, so that the service's sweep, once a
--          second, still finds and counts the leases that expire last.
-- KEYS[2]  <prefix>:{<policy>@<incarnation>}:lease:<escaped key>, one subject's leases (absent
--          for a sweep): a sorted set of each lease's member string, `<32 hex>:<cost>`, scored
--          by its expiry in µs; and the member `in_use`, scored -(sum of the costs of every
--          lease in the set, expired or not) - 1, so that the sum never needs a walk over the
--          live leases and its score is below every expiry (>= 1). The key expires when its
--          last lease does (PEXPIREAT the latest expiry in ms, rounded up; with an explicit
--          time, PEXPIRE the same from that time).
-- ARGV[1]  'take', 'renew', 'release', 'reset' (every lease of the subject), 'look' or
--          'sweep' (the ledger alone)
-- ARGV[2]  the lease's member string (unused by look, sweep and reset); the stores check its form,
--          and that a take's names its cost, before calling
-- ARGV[3]  cost: the units a take holds or a look asks about, 1..10000
-- ARGV[4]  lease_us: a take's or a renewal's lifetime from now, µs
-- ARGV[5]  limit: the policy's limit now
-- ARGV[6]  the current time in µs, or empty for Redis TIME (explicit times are for tests)
-- ARGV[7]  a take's deadline in µs, or empty: a take decided after it grants nothing and
--          changes nothing (its sender has answered its client without it)
-- Reply    {ok (0|1), in_use, expires_in_us, retry_after_us, expired, leases, now}, as
--          LeaseAnswer's fields
-- Flags    `#!lua` (refused whole, with OOM, while Redis is over maxmemory); look's
--          `#!lua flags=no-writes`
--
-- Every value is an integer below 2^53 (times about 1.8e15 µs, sums at most 10000), so Lua's
-- doubles and the set's scores hold them exactly; numbers go back to Redis through
-- string.format('%d'), never tostring (see common.lua).

local ledger, key = KEYS[1], KEYS[2]
local op, member = ARGV[1], ARGV[2]
local cost, lease, limit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local clock = ARGV[6] == ''
local now
if clock then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[6])
end
local NOW = string.format('%d', now)
local SUM = 'in_use'
local LEDGER_GRACE_MS = 60000

-- The cost a member holds, from its string. (Every member in the set came through a take,
-- whose member the store checked; this fails the script, before any write, on one that did not.)
local function cost_of(m)
  local c = tonumber(string.match(m, ':(%d+)$'))
  if not c then
    error('concurrency.lua: a lease member without a cost: ' .. m)
  end
  return c
end

-- The subject's leases: the costs of every lease in its set, then of the expired ones
-- (expiry <= now), and the live ones' sum.
local in_use, dead = 0, {}
if key then
  local held = 0
  local score = redis.call('ZSCORE', key, SUM)
  if score then
    held = -tonumber(score) - 1
  end
  dead = redis.call('ZRANGEBYSCORE', key, 0, NOW)
  local dead_cost = 0
  for _, m in ipairs(dead) do
    dead_cost = dead_cost + cost_of(m)
  end
  in_use = held - dead_cost
end

-- The time until the subject's earliest live lease expires; 0 when none is live.
local function earliest_wait()
  local first = redis.call('ZRANGEBYSCORE', key, '(' .. NOW, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] then
    return tonumber(first[2]) - now
  end
  return 0
end

--- look
local ok, retry = 0, 0
if in_use + cost <= limit then
  ok = 1
else
  retry = earliest_wait()
end
return {ok, in_use, 0, retry, 0, redis.call('ZCOUNT', ledger, '(' .. NOW, '+inf'), now}
--- change
-- Every expiry of the policy is counted here, once: the call that drops it from the ledger.
local expired = redis.call('ZREMRANGEBYSCORE', ledger, 0, NOW)
if op == 'sweep' then
  return {0, 0, 0, 0, expired, redis.call('ZCARD', ledger), now}
end
if op == 'reset' then
  -- The live leases only: an expired one's ledger entry went with the sweep above.
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. NOW, '+inf')
  for _, m in ipairs(live) do
    redis.call('ZREM', ledger, m)
  end
  redis.call('DEL', key)
  return {#live > 0 and 1 or 0, 0, 0, 0, expired, redis.call('ZCARD', ledger), now}
end
if member == SUM then
  error('concurrency.lua: ' .. SUM .. ' is not a lease member')
end
local late = op == 'take' and ARGV[7] ~= nil and ARGV[7] ~= '' and now > tonumber(ARGV[7])

-- Sets k to expire `grace` ms after its highest score, the latest expiry it holds.
local function expire_with_last(k, grace)
  local last = tonumber(redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')[2])
  if clock then
    redis.call('PEXPIREAT', k, string.format('%d', math.ceil(last / 1000) + grace))
  else
    redis.call('PEXPIRE', k, string.format('%d', math.ceil((last - now) / 1000) + grace))
  end
end

local changed = #dead > 0
if changed then
  redis.call('ZREMRANGEBYSCORE', key, 0, NOW)
end
local ok, expires_in, retry = 0, 0, 0
local expiry = string.format('%d', now + lease)
if (op == 'take' and not late) or op == 'renew' then
  -- Live, or not there at all: the expired ones are gone, and `in_use`'s score is below now.
  local at = redis.call('ZSCORE', key, member)
  if at and tonumber(at) > now then
    redis.call('ZADD', key, 'XX', expiry, member)
    ok = 1
  elseif op == 'take' and in_use + cost <= limit then
    redis.call('ZADD', key, expiry, member)
    in_use = in_use + cost
    ok = 1
  elseif op == 'take' then
    retry = earliest_wait()
  end
  if ok == 1 then
    redis.call('ZADD', ledger, expiry, member)
    expire_with_last(ledger, LEDGER_GRACE_MS)
    expires_in = lease
    changed = true
  end
elseif op == 'release' then
  local at = redis.call('ZSCORE', key, member)
  if at and tonumber(at) > now then
    local c = cost_of(member)
    redis.call('ZREM', key, member)
    -- The ledger's expiry stays: it only ever needs to outlive what the ledger holds.
    redis.call('ZREM', ledger, member)
    in_use = in_use - c
    ok = 1
    changed = true
  end
end
if changed then
  redis.call('ZADD', key, string.format('%d', -in_use - 1), SUM)
  if redis.call('ZCARD', key) == 1 then
    -- No lease left, only the sum's member: nothing to keep.
    redis.call('DEL', key)
  else
    expire_with_last(key, 0)
  end
end
return {ok, in_use, expires_in, retry, expired, redis.call('ZCARD', ledger), now}
