-- sliding_window_log.lua: at most `limit` units in any trailing window of `window_us`, exactly.
-- Mirrors src/limiter/sliding_window_log.rs. One limit's part of a decision script: see
-- common.lua.
--
-- key          the limit's log: a sorted set with one member per granted request, scored by its
--              time in µs; a member is "<total>:<cost>": the request's cost, and the running
--              total of units granted to this log up to and including it, zero-padded to 16
--              digits so that members of the same time sort in grant order
-- ARGV[a + 1]  limit (at most 10,000)
-- ARGV[a + 2]  window_us
--
-- Units in the window are the newest member's total minus the total before the oldest one, so
-- one request costs Redis the same whatever its cost. Per call, on a log of n <= limit members:
-- an allowed request runs 4 commands (ZRANGE newest, ZRANGE oldest, ZADD, PEXPIRE; 3 on an empty
-- log), and 2 more (ZREMRANGEBYSCORE, ZRANGE) when members have left the window; one that does not
-- fit runs at most 5 and then binary-searches by rank for the member whose departure frees enough,
-- at most ceil(log2(n)) + 1 more ZRANGEs (15 at 10,000); each command is O(log n). The exception
-- is ZREMRANGEBYSCORE, O(log n + m) for the m members that left the window: m <= limit, and each
-- of them was inserted, and paid for, by an earlier request. The log holds at most `limit`
-- members.
-- Totals restart at 0 whenever the log is empty, so they stay exact (below 2^53) unless a
-- subject's log never empties for decades at the highest rate.
--
-- Time never runs backwards past the newest member. Keep only drops members that have left the
-- window.

local limit = tonumber(ARGV[a + 1])
local window_us = tonumber(ARGV[a + 2])

local t, total, newest = now, 0, nil
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[1] then
  newest = tonumber(last[2])
  if newest > t then
    t = newest
  end
  total = tonumber(string.match(last[1], '^(%d+)'))
end

-- `before`: the running total just before the oldest member still in the window. Entries at or
-- before the horizon have left it; the oldest is read first, so that the removal is made only
-- when one has (an empty log needs neither).
local count, before = 0, 0
if newest then
  local horizon = t - window_us
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if tonumber(oldest[2]) <= horizon then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', horizon))
    oldest = redis.call('ZRANGE', key, 0, 0)
  end
  if oldest[1] then
    local c, n = string.match(oldest[1], '^(%d+):(%d+)$')
    before = tonumber(c) - tonumber(n)
    count = total - before
  else
    total = 0
  end
end

local admits = count + cost <= limit
--- take
total = total + cost
redis.call('ZADD', key, string.format('%d', t), string.format('%016d:%d', total, cost))
out_reset = t + window_us - now
redis.call('PEXPIRE', key, math.ceil(out_reset / 1000))
out_remaining = limit - count - cost
--- keep
out_remaining = math.max(limit - count, 0)
if newest then
  out_reset = math.max(newest + window_us - now, 0)
end
if not admits then
  -- The request fits once the oldest (count + cost - limit) units have left the window: at the
  -- time of the first member whose running total reaches `target`. The newest one does (cost <=
  -- limit), so the search starts with it as the answer.
  local target = before + count + cost - limit
  local lo, hi = 0, redis.call('ZCARD', key) - 1
  local leaves_at = nil
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', key, mid, mid, 'WITHSCORES')
    if tonumber(string.match(m[1], '^(%d+)')) >= target then
      hi, leaves_at = mid, tonumber(m[2])
    else
      lo = mid + 1
    end
  end
  if leaves_at == nil then
    leaves_at = tonumber(redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')[2])
  end
  out_retry = leaves_at + window_us - now
end
