-- The classic sliding window counter, as widely copied: one key per window number and float
-- weights; a clock stepping back reads an older window's counts.
-- KEYS[1] base key; ARGV: limit, window_us, cost, now_us. Reply as ours.
local limit, window, cost, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local number = math.floor(now / window)
local current_key = KEYS[1] .. ':' .. number
local previous = tonumber(redis.call('GET', KEYS[1] .. ':' .. (number - 1)) or '0')
local current = tonumber(redis.call('GET', current_key) or '0')
local estimate = previous * ((window - (now - number * window)) / window) + current
if estimate + cost > limit then
  return {0, limit - estimate, 2 * window, window - (now - number * window)}
end
redis.call('INCRBY', current_key, cost)
redis.call('PEXPIRE', current_key, math.ceil(2 * window / 1000))
return {1, limit - estimate - cost, 2 * window, 0}
