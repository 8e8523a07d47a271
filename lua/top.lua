#!lua
-- top.lua: folds one instance's top-offender summaries of a policy (service::top) into the
-- minute's summaries that every instance shares, in one atomic step on the policy's hash tag.
-- Flagged, so that Redis refuses it whole while out of memory (the instance keeps its summaries
-- and folds them with the next ones).
--
-- Weighted Space-Saving (Metwally, Agrawal, El Abbadi, ICDT 2005), the steps of
-- `Summary::add` in src/service/top/summary.rs: a member already tracked gains the count; a new
-- one is added while the set holds fewer than the capacity; otherwise the smallest member is
-- evicted and the new one takes its count plus its own. `f<d>` keeps the largest count evicted:
-- every count overstates its subject by at most that, and an untracked subject has at most that.
-- `c<d>` adds up the bounds of the folded summaries, `t<d>` their decisions.
--
-- A fold is applied once: `s<instance>` keeps the sequence number of the last fold applied from
-- that instance to the minute, and a fold whose number is not above it changes nothing (the
-- instance sends a fold whose outcome it does not know again, unchanged: store::top::FoldId).
--
-- KEYS[1], KEYS[2], KEYS[3]: the minute's sorted sets of denied, allowed and near-limit counts;
-- KEYS[4]: the minute's hash (t1..t3, c1..c3, f1..f3, s<instance>).
-- ARGV[1]: the capacity; ARGV[2]: the keys' TTL in seconds; ARGV[3]: the instance's id (hex);
-- ARGV[4]: the fold's sequence number; then, per dimension in that order: its total, its bound,
-- n, and n pairs of member and count.
-- Reply: 1 when applied, 0 when that fold was applied before.
local cap = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local meta = KEYS[4]
local folded = 's' .. ARGV[3]
local seq = tonumber(ARGV[4])
if seq <= tonumber(redis.call('HGET', meta, folded) or '0') then
  return 0
end
redis.call('HSET', meta, folded, ARGV[4])
local at = 5
for d = 1, 3 do
  local set = KEYS[d]
  local total = tonumber(ARGV[at])
  local bound = tonumber(ARGV[at + 1])
  local n = tonumber(ARGV[at + 2])
  at = at + 3
  if total > 0 or bound > 0 then
    local card = redis.call('ZCARD', set)
    local evicted = -1
    for _ = 1, n do
      local member = ARGV[at]
      local count = tonumber(ARGV[at + 1])
      at = at + 2
      if redis.call('ZSCORE', set, member) then
        redis.call('ZINCRBY', set, count, member)
      elseif card < cap then
        redis.call('ZADD', set, count, member)
        card = card + 1
      else
        local popped = redis.call('ZPOPMIN', set)
        local least = tonumber(popped[2])
        if least > evicted then
          evicted = least
        end
        redis.call('ZADD', set, least + count, member)
      end
    end
    redis.call('HINCRBY', meta, 't' .. d, total)
    redis.call('HINCRBY', meta, 'c' .. d, bound)
    if evicted >= 0 then
      local floor = tonumber(redis.call('HGET', meta, 'f' .. d) or '0')
      if evicted > floor then
        redis.call('HSET', meta, 'f' .. d, string.format('%d', evicted))
      end
    end
    if card > 0 then
      redis.call('EXPIRE', set, ttl)
    end
  else
    at = at + 2 * n
  end
end
redis.call('EXPIRE', meta, ttl)
return 1
