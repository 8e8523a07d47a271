-- common.lua: helpers prepended to every decision script when it is loaded (see
-- src/store/scripts.rs). It has no KEYS, ARGV or reply of its own.
--
-- The line before it, `#!lua`, is added by src/store/scripts.rs and must stay the first line of
-- every decision script: a Redis 7 flagged script (with no `allow-oom`) is refused whole while
-- Redis is over `maxmemory`, so an out-of-memory Redis answers OOM and nothing is half-written.
--
-- Lua numbers are doubles: integers are exact only below 2^53 (9007199254740992). Times are
-- microseconds (about 1.7e15 today), so every value stays exact as long as products are formed
-- through muldiv (lua/muldiv.lua). A timestamp handed back to Redis goes through
-- string.format('%d'), never tostring: Redis before 7 prints numbers with 14 digits, which
-- would corrupt a 16-digit timestamp (TTLs in ms have at most 13 and pass as numbers).

-- The decision time, `now` in µs: Redis's own clock, so that every service instance shares one,
-- or the explicit time that tests pass. The time is always the last argument: empty for TIME.
-- (Straight-line code rather than a function: each function is a closure created on every call,
-- which measurably costs in a script this short.)
local now = ARGV[#ARGV]
if now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(now)
end
