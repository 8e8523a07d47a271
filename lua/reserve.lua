-- reserve.lua: a reservation (issue 29) over a policy's limits: `cost` booked on every limit
-- for the earliest time, no later than the wait accepted, at which every limit admits it.
-- Mirrors src/limiter/reservation.rs (reserve), whose module doc states the rules.
-- src/store/redis/scripts.rs (compose_reserve) puts it together: lua/common.lua and the helpers,
-- then per limit a function `looks[i](at)` (the limit's level and keep sections,
-- lua/<algorithm>.lua, at the time `at`: whether it admits `cost`, remaining, reset_after_us
-- and retry_after_us, from `at`), then `take()` (an acquire's body, as lua/common.lua composes
-- it, at `now`), then `n_limits` and `max_wait`, then this file.
--
-- KEYS[i]      the i-th limit's state key, as for an acquire
-- KEYS[n + 1]  the subject's queue: the latest time anything is booked for (µs, a string), on
--              the subject's hash tag; missing or passed, there is none
-- ARGV         as an acquire's (lua/common.lua), then ARGV[m + 1]: the longest wait accepted, µs
-- Reply        an acquire's reply (lua/common.lua), every time measured from the caller's now,
--              then delay_us (how long to wait before acting; 0 when the cost fits now, and for
--              a denial) and the queue it leaves (µs; 0 for none)
--
-- Every limit is looked at from base = max(now, queue) (nothing is admitted before what was
-- booked ahead), then at base plus the longest retry, again until every limit admits (at most
-- 8 looks); past the wait accepted it is denied and nothing is taken. Otherwise every limit
-- takes the cost at that time, `act`, as an acquire at `act` would (the parts' takes write
-- their states, and their expiries measured from `act`: lua/common.lua's `take_delay_us`), and
-- the queue moves to `act`.

local caller = now
local queue_key = KEYS[n_limits + 1]
local queued = tonumber(redis.call('GET', queue_key) or '0') or 0
if queued <= caller then
  -- Passed: none (a key its expiry has not reached yet, on a clock that stepped back, is
  -- dropped, so that it never returns).
  if queued > 0 then
    redis.call('DEL', queue_key)
  end
  queued = 0
end
local base = math.max(caller, queued)
local first = {}
local act, settled = base, false
for look = 0, 7 do
  local wait = 0
  for i = 1, n_limits do
    local admits, remaining, reset, retry = looks[i](act)
    if not admits then
      wait = math.max(wait, retry, 1)
    end
    if look == 0 then
      first[i] = {admits, remaining, reset, retry}
    end
  end
  if wait == 0 then
    settled = true
    break
  end
  act = act + wait
  if act - caller > max_wait then
    break
  end
end
local delay = act - caller

if settled and delay <= max_wait then
  -- Decided at `act`; every expiry a take writes is moved on by the delay (common.lua's
  -- `take_delay_us`), so that each state is kept until its units have counted.
  now, take_delay_us = act, delay
  local reply = take()
  for i = 1, n_limits do
    reply[4 * i] = math.min(reply[4 * i] + delay, MAX_WAIT_US)
  end
  reply[4 * n_limits + 2] = caller
  if delay > 0 then
    redis.call('SET', queue_key, string.format('%d', act), 'PX', math.ceil(delay / 1000))
    queued = act
  end
  reply[#reply + 1] = delay
  reply[#reply + 1] = queued
  return reply
end

-- Denied, nothing taken, the queue as it was: each limit as it stands at base, denying when
-- the first time it admits, from now, is past the wait accepted; when none is alone (their
-- times only met past it), the one that admits last denies, with the booking's delay.
local shift = base - caller
local reply = {0}
local last, latest, none = 1, 0, true
for i = 1, n_limits do
  local admits, remaining, reset, retry = first[i][1], first[i][2], first[i][3], first[i][4]
  local own = shift
  if not admits then
    own = shift + math.max(retry, 1)
  end
  local denies = own > max_wait
  if denies then
    none = false
  end
  reply[4 * i - 2] = denies and 0 or 1
  reply[4 * i - 1] = remaining
  reply[4 * i] = math.min(reset + shift, MAX_WAIT_US)
  reply[4 * i + 1] = denies and math.min(own, MAX_WAIT_US) or 0
  if own > latest then
    last, latest = i, own
  end
end
if none then
  reply[4 * last - 2] = 0
  reply[4 * last + 1] = math.min(delay, MAX_WAIT_US)
end
reply[4 * n_limits + 2] = caller
for i = 1, n_limits do
  reply[4 * n_limits + 2 + i] = 0
end
reply[5 * n_limits + 3] = 0
reply[5 * n_limits + 4] = queued
return reply
