-- sliding_window_log.lua: at most `limit` units in any trailing window of `window_us`, exactly.
-- Mirrors src/limiter/sliding_window_log.rs.
--
-- KEYS[1]  the subject's log: a sorted set with one member per granted unit, scored by its
--          time in µs; members are "<time>:<n>", n counting the units granted at that time
--          (zero-padded to 5 digits, so that the largest member of a time sorts last), so
--          units granted in the same microsecond stay distinct
-- ARGV[1]  limit (at most 10,000)
-- ARGV[2]  window_us
-- ARGV[3]  cost (1 <= cost <= limit)
-- ARGV[4]  the current time in µs, or empty for Redis TIME (explicit times are for tests);
--          read by common.lua into `now`
-- Reply    {allowed (0|1), remaining, reset_after_us, retry_after_us}
-- Flags    `#!lua` (see common.lua): refused whole, with OOM, while Redis is over maxmemory
--
-- Time never runs backwards past the newest member. A denial only drops members that have left
-- the window.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_us = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t, seq, newest = now, 0, nil
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[1] then
  newest = tonumber(last[2])
  if newest >= now then
    t = newest
    seq = tonumber(string.match(last[1], ':(%d+)$'))
  end
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', t - window_us))
local count = redis.call('ZCARD', key)
if count == 0 then
  newest = nil
end

if count + cost <= limit then
  local ts = string.format('%d', t)
  if cost == 1 then
    redis.call('ZADD', key, ts, ts .. ':' .. string.format('%05d', seq + 1))
  else
    -- In batches: unpack() of thousands of arguments overflows Lua's C stack.
    local args, n = {}, 0
    for i = 1, cost do
      args[n + 1] = ts
      args[n + 2] = ts .. ':' .. string.format('%05d', seq + i)
      n = n + 2
      if n == 1000 or i == cost then
        redis.call('ZADD', key, unpack(args, 1, n))
        n = 0
      end
    end
  end
  local reset = t + window_us - now
  redis.call('PEXPIRE', key, math.ceil(reset / 1000))
  return {1, limit - count - cost, reset, 0}
end

-- The request fits once the oldest (count + cost - limit) units have left the window.
local leaving = redis.call('ZRANGE', key, count + cost - limit - 1, count + cost - limit - 1, 'WITHSCORES')
local retry = tonumber(leaving[2]) + window_us - now
local reset = math.max(newest + window_us - now, 0)
return {0, math.max(limit - count, 0), reset, retry}
