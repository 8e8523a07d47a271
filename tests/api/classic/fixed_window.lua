-- The classic fixed window, as widely copied, kept to show that our tests catch its flaws:
-- one key per window number, INCRBY first and compare after, so a denied request still
-- consumes; a clock stepping back lands in an older window's (empty) key.
-- KEYS[1] base key; ARGV: limit, window_us, cost, now_us. Reply as ours.
local limit, window, cost, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local number = math.floor(now / window)
local key = KEYS[1] .. ':' .. number
local count = redis.call('INCRBY', key, cost)
if count == cost then
  redis.call('PEXPIRE', key, math.ceil(window / 1000))
end
local reset = (number + 1) * window - now
if count > limit then
  return {0, 0, reset, reset}
end
return {1, limit - count, reset, 0}
