-- sliding_window_log.lua: at most `limit` units in any trailing window of `window_us`, exactly.
-- Mirrors src/limiter/sliding_window_log.rs. One limit's part of a decision script: see
-- common.lua.
--
-- key          the limit's log: a sorted set with one member per time at which units were
--              logged, scored by that time in µs; a member is "<total>:<cost>:<window_us>": the
--              running total of units logged up to and including it, zero-padded to 16 digits,
--              the units logged at that time, and the window they were logged under. The newest
--              member's window is the log's (the one that set its expiry); members of earlier
--              builds are "<total>:<cost>", and a log whose newest member does not say is read
--              as logged under the window decided (logs written by earlier builds may hold
--              several members of one time, which sort in the order they were logged and are
--              read alike)
-- ARGV[a + 1]  limit (at most 10,000)
-- ARGV[a + 2]  window_us
--
-- Units in the window are the newest member's total minus the total before the oldest one in the
-- window (its total minus its cost), so one request costs Redis the same whatever its cost.
-- Members that have left the window stay until a section that writes (take, report, refund)
-- removes them: the level only reads, so that a peek writes nothing.
--
-- Debt: a report logs its units whether they fit or not, but never past 2 * limit units in the
-- window; units beyond are not logged. Acquires are denied until enough members have left the
-- window, so time pays the debt back member by member. Every member holds at least one unit, so
-- the log holds at most 2 * limit members in the window (20,000).
--
-- Refund: gives back units of members in the window by lowering their costs (a member whose cost
-- reaches 0 is removed). With a mark (a ticket's: the take's time plus window_us), only the
-- member of time mark - window_us gives, and only while at most REACH members follow it; without
-- one, the newest members, at most REACH of them. Totals must stay running totals, so every
-- member after those that gave is rewritten with its total lowered by the units given (at most
-- REACH, in one ZADD); a refund without a mark gives from the newest members, which have none
-- after them. The members that stay are written anew before the newest of them is removed, so
-- that the key, and its expiry, never disappear meanwhile; the expiry is never moved.
--
-- Cost, the same bound for every section: besides the member it logs, a call removes or writes
-- at most REACH (256) members. A write removes at most REACH of those that have left the window
-- (ZCOUNT, ZREMRANGEBYRANK), or, when none is left in it, the whole key with one UNLINK, which
-- Redis frees outside its main thread; members left over count again only if the clock steps
-- back, as any stored member does, and go with the next writes. Every other command is
-- O(log n) on a log of n members: an allowed request runs 4 (ZRANGE newest, ZRANGE oldest, ZADD,
-- PEXPIRE; 3 on an empty log; one more, ZREM, when it joins the newest member of its time), and 2
-- or 3 more (ZRANGE BYSCORE for the oldest in the window, the removal) when members have left the
-- window. One that does not fit runs the level's 3 at most, and no more when the oldest member in
-- the window frees enough (always for one unit on a full log) or only the newest does (a request
-- of the whole limit); otherwise ZCARD, then a binary search by rank for the member whose
-- departure frees enough among the last min(n, limit - cost + 1), at most ceil(log2(limit))
-- ZRANGEs (14 at 10,000). A report runs the level, the removal, ZADD and PEXPIRE, and ZCARD and
-- the same search (for one unit) when it leaves nothing available; a refund the level, ZCOUNT
-- with a mark, one ZRANGE for the members that give (and one for those after them, with a mark),
-- the removal, ZREMRANGEBYRANK, ZADD, ZREM, and when nothing is available after it ZCARD and a
-- search over all n members, at most ceil(log2(n)) ZRANGEs.
-- Totals restart at 0 whenever the log is empty, so they stay exact (below 2^53) unless a
-- subject's log never empties for decades at the highest rate.
--
-- A change of parameters (limit or window): the members carry over. They count in the shorter of
-- the log's window and the one decided (`span`); the first take or report under a longer one
-- makes it the log's. A refund never changes the log's window: when it removes the newest member,
-- the one that becomes newest is rewritten to carry it. So the key expires when its last member
-- has left the log's window, and a state past its expiry answers as a missing key.
--
-- Time never runs backwards past the newest member. Keep writes nothing; members that have left
-- the window but are still stored count again if the clock steps back before the next write, as
-- in the Rust model, which drops entries only where this script writes, and as many.

local limit = tonumber(ARGV[a + 1])
local window_us = tonumber(ARGV[a + 2])
local REACH = 256 -- src/limiter/sliding_window_log.rs, REACH

-- `logged`: the window the log was last logged under, carried by the newest member (a log
-- whose newest member does not say, written before it was kept, is read as logged under
-- window_us). Members count for the shorter of the two windows, `span`.
local t, total, newest = now, 0, nil
local logged, has_logged = window_us, false
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[1] then
  newest = tonumber(last[2])
  if newest > t then
    t = newest
  end
  total = tonumber(string.match(last[1], '^(%d+)'))
  local lw = tonumber(string.match(last[1], '^%d+:%d+:(%d+)$'))
  if lw and lw > 0 then
    logged, has_logged = lw, true
  end
end
local span = math.min(window_us, logged)

-- `first` and `first_at`: the running total and the time of the oldest member still in the
-- window; `before`: the running total just before it. Members at or before the horizon have left
-- it (`stale`: some are still stored). The oldest member is read by rank first, so that the
-- search by score is made only when one has left (an empty log needs neither).
local horizon = t - span
local count, before, stale, first, first_at, all_gone = 0, 0, false, 0, 0, false
if newest then
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  first_at = tonumber(oldest[2])
  if first_at <= horizon then
    stale = true
    oldest = redis.call('ZRANGE', key, '(' .. string.format('%d', horizon), '+inf', 'BYSCORE',
      'LIMIT', 0, 1, 'WITHSCORES')
    first_at = tonumber(oldest[2])
  end
  if oldest[1] then
    local c, n = string.match(oldest[1], '^(%d+):(%d+)')
    first = tonumber(c)
    before = first - tonumber(n)
    count = total - before
  else
    -- Every member has left: the log is empty, and the next one written starts the totals anew
    -- (after the others are removed).
    total = 0
    all_gone = true
  end
end

local admits = count + cost <= limit
--- take
-- At most REACH members that left the window go (see the header), or the whole log at once.
if all_gone then
  redis.call('UNLINK', key)
elseif stale then
  local gone = redis.call('ZCOUNT', key, '-inf', string.format('%d', horizon))
  redis.call('ZREMRANGEBYRANK', key, 0, math.min(gone, REACH) - 1)
end
total = total + cost
if newest == t then
  -- One member per time: the newest, of this time, takes the units too.
  redis.call('ZADD', key, string.format('%d', t), string.format('%016d:%d:%d', total,
    tonumber(string.match(last[1], '^%d+:(%d+)')) + cost, window_us))
  redis.call('ZREM', key, last[1])
else
  redis.call('ZADD', key, string.format('%d', t), string.format('%016d:%d:%d', total, cost, window_us))
end
out_reset = t + window_us - now
redis.call('PEXPIRE', key, math.ceil((out_reset + take_delay_us) / 1000))
out_remaining = limit - count - cost
--- keep
out_remaining = math.max(limit - count, 0)
if newest then
  out_reset = math.max(newest + span - now, 0)
end
if not admits then
  -- The request fits once the oldest (count + cost - limit) units have left the window: at the
  -- time of the first member whose running total reaches `target`. The level has read two
  -- candidates: the oldest member in the window, which is the one when it holds enough (always
  -- for one unit on a full log), and the newest, which reaches `target` (cost <= limit) and is
  -- the one when `target` is its total (a request of the whole limit). Otherwise the search by
  -- rank starts with the newest as the answer, among the last `total - target + 1` members (each
  -- holds at least one unit). Members that have left the window but are still stored come
  -- first, with totals below `target`: the search passes them.
  local target = before + count + cost - limit
  local leaves_at = first_at
  if first < target then
    leaves_at = newest
    if target < total then
      local n = redis.call('ZCARD', key)
      local lo, hi = math.max(n - (total - target + 1), 0), n - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local m = redis.call('ZRANGE', key, mid, mid, 'WITHSCORES')
        if tonumber(string.match(m[1], '^(%d+)')) >= target then
          hi, leaves_at = mid, tonumber(m[2])
        else
          lo = mid + 1
        end
      end
    end
  end
  out_retry = leaves_at + span - now
end
--- report
-- Logs what fits under the debt bound, 2 * limit units in the window.
out_units = math.max(math.min(cost, 2 * limit - count), 0)
if out_units > 0 then
  if all_gone then
    redis.call('UNLINK', key)
  elseif stale then
    local gone = redis.call('ZCOUNT', key, '-inf', string.format('%d', horizon))
    redis.call('ZREMRANGEBYRANK', key, 0, math.min(gone, REACH) - 1)
  end
  total = total + out_units
  count = count + out_units
  if newest == t then
    redis.call('ZADD', key, string.format('%d', t), string.format('%016d:%d:%d', total,
      tonumber(string.match(last[1], '^%d+:(%d+)')) + out_units, window_us))
    redis.call('ZREM', key, last[1])
  else
    redis.call('ZADD', key, string.format('%d', t), string.format('%016d:%d:%d', total, out_units, window_us))
  end
  newest = t
  logged, has_logged, span = window_us, true, window_us
  redis.call('PEXPIRE', key, math.ceil((t + window_us - now + take_delay_us) / 1000))
end
-- The subject as it stands, as keep describes it for one unit.
out_remaining = math.max(limit - count, 0)
if newest then
  out_reset = math.max(newest + span - now, 0)
end
if out_remaining == 0 then
  local target = before + count + 1 - limit
  -- The newest member reaches `target`, and at most `total - target + 1` members do (see keep).
  local n = redis.call('ZCARD', key)
  local lo, hi = math.max(n - (total - target + 1), 0), n - 1
  local leaves_at = newest
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', key, mid, mid, 'WITHSCORES')
    if tonumber(string.match(m[1], '^(%d+)')) >= target then
      hi, leaves_at = mid, tonumber(m[2])
    else
      lo = mid + 1
    end
  end
  out_retry = leaves_at + span - now
end
--- refund
-- `members`: those that may give, newest first (score after member): the newest in the window,
-- or those of the mark's time while it is in the window. At most `want` of them are needed, as
-- each holds at least one unit.
local want = math.min(cost, count)
local members = {}
local at = nil
if want > 0 then
  if mark == nil then
    members = redis.call('ZRANGE', key, '+inf', '(' .. string.format('%d', horizon), 'BYSCORE',
      'REV', 'LIMIT', 0, math.min(want, REACH), 'WITHSCORES')
  elseif mark - logged > horizon and mark - logged <= newest then
    -- The mark is its take's time plus the window it logged under: the log's.
    at = string.format('%d', mark - logged)
    -- Only while at most REACH members follow, whose totals are rewritten below.
    if redis.call('ZCOUNT', key, '(' .. at, '+inf') <= REACH then
      members = redis.call('ZRANGE', key, at, at, 'BYSCORE', 'REV', 'LIMIT', 0,
        math.min(want, REACH), 'WITHSCORES')
    end
  end
end
-- Each gives all it holds, but the last one that gives (`partial`) may give only part: its cost
-- and its total drop by that part, its total being the running total up to it.
-- (`rest`: what follows a member's units, the window it was logged under if it says.)
local left, touched, partial, partial_old, partial_at = want, 0, nil, nil, nil
local partial_c, partial_n, partial_rest = 0, 0, ''
for i = 1, #members, 2 do
  local c, n, rest = string.match(members[i], '^(%d+):(%d+)(.*)$')
  c, n = tonumber(c), tonumber(n)
  touched = touched + 1
  if n > left then
    partial = true
    partial_c, partial_n, partial_rest = c - left, n - left, rest
    partial_old, partial_at = members[i], members[i + 1]
    left = 0
  else
    left = left - n
  end
  if left == 0 then
    break
  end
end
out_units = want - left
if out_units > 0 then
  -- Something in the window gives, so the log is not all gone.
  if stale then
    local gone = redis.call('ZCOUNT', key, '-inf', string.format('%d', horizon))
    redis.call('ZREMRANGEBYRANK', key, 0, math.min(gone, REACH) - 1)
  end
  -- The members that stay and change, with their new strings: the partial one, and every one
  -- after the mark's time (none without a mark: the newest gave), whose totals drop by all that
  -- was given. Those that gave are the `touched` highest ranks below these.
  local later = {}
  if at then
    later = redis.call('ZRANGE', key, '(' .. at, '+inf', 'BYSCORE', 'WITHSCORES')
  end
  -- The newest member that stays carries the log's window (`logged`, when the log says it):
  -- the partial one is the newest when nothing follows it.
  local logged_rest = ':' .. string.format('%d', logged)
  local adds = {}
  if partial then
    if #later == 0 and has_logged then
      partial_rest = logged_rest
    end
    adds[1], adds[2] = partial_at, string.format('%016d:%d%s', partial_c, partial_n, partial_rest)
  end
  for i = 1, #later, 2 do
    local c, n, rest = string.match(later[i], '^(%d+):(%d+)(.*)$')
    adds[#adds + 1] = later[i + 1]
    adds[#adds + 1] = string.format('%016d:%d%s', tonumber(c) - out_units, tonumber(n), rest)
  end
  -- Every changed or emptied member is removed but the newest that stays (`last`), which goes
  -- after the new strings are in: the key is never empty meanwhile, so it keeps its expiry. The
  -- new totals are all below `last`'s and above those of the members left alone, so no new
  -- string is an old one.
  local m = #later / 2
  local last_old = nil
  if m > 0 then
    last_old = later[#later - 1]
    redis.call('ZREMRANGEBYRANK', key, -(touched + m), -2)
  elseif partial then
    last_old = partial_old
    if touched > 1 then
      redis.call('ZREMRANGEBYRANK', key, -(touched - 1), -1)
    end
  else
    redis.call('ZREMRANGEBYRANK', key, -touched, -1)
  end
  -- At most REACH + 1 members: one ZADD (Lua's unpack takes fewer than 8,000 values).
  if #adds > 0 then
    redis.call('ZADD', key, unpack(adds))
  end
  if last_old then
    redis.call('ZREM', key, last_old)
  end
  count = count - out_units
  if m == 0 then
    if partial then
      newest = tonumber(partial_at)
    else
      -- The newest member left, in the window or not (members that left it may stay): the one
      -- now newest takes over the log's window.
      local l = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      newest = l[2] and tonumber(l[2])
      if l[1] and has_logged then
        local c, n, rest = string.match(l[1], '^(%d+):(%d+)(.*)$')
        if rest ~= logged_rest then
          redis.call('ZADD', key, l[2], string.format('%s:%s%s', c, n, logged_rest))
          redis.call('ZREM', key, l[1])
        end
      end
    end
  end
end
-- The subject as it stands, as keep describes it for one unit.
out_remaining = math.max(limit - count, 0)
if newest then
  out_reset = math.max(newest + span - now, 0)
end
if out_remaining == 0 then
  local target = before + count + 1 - limit
  -- The newest member, at `newest`, reaches `target`: the search starts with it as the answer.
  local lo, hi = 0, redis.call('ZCARD', key) - 1
  local leaves_at = newest
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', key, mid, mid, 'WITHSCORES')
    if tonumber(string.match(m[1], '^(%d+)')) >= target then
      hi, leaves_at = mid, tonumber(m[2])
    else
      lo = mid + 1
    end
  end
  out_retry = leaves_at + span - now
end
