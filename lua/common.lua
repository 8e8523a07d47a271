-- common.lua: the head of every decision script, which src/store/redis/scripts.rs puts together from
-- this file, the helpers some algorithms need (lua/muldiv.lua), and one part per limit of the
-- policy, in policy order, each part being lua/<algorithm>.lua. There is one script per
-- operation (acquire, peek, report, refund) and combination of algorithms.
--
-- KEYS[i]      the state key of the policy's i-th limit
-- ARGV[1]      cost: the units to take (acquire, peek: 1 <= cost <= every limit's quota;
--              report: 1 <= cost <= 10^9), or to give back (refund)
-- ARGV[2]      the current time in µs, or empty for Redis TIME (explicit times are for tests)
-- ARGV[3...]   each limit's parameters in policy order: the i-th limit's start at ARGV[a + 1],
--              where `a` is 2 plus the number of parameters of the limits before it; its file
--              names them
-- ARGV[m + i]  refund only, after every parameter: the i-th limit's mark from a ticket (see
--              src/limiter/mod.rs, Mark and Rule::refund), or empty for a refund without a
--              ticket; the part reads it as `mark` (a number, or nil). ARGV[m + n + i] is the
--              i-th limit's refund count the ticket kept (`mark_refunded`), and ARGV[m + 2n + 1]
--              the take's time (`mark_taken`), both empty without a ticket
-- KEYS[n + 1]  refund only, with a ticket (n limits): the ticket's record of the units refunded
--              with it, on the subject's hash tag; then ARGV[m + 2n + 2] is the ticket's units
--              and ARGV[m + 2n + 3] the end of its life (µs). The refund gives back at most the
--              units the record does not hold yet, and adds what it gave (the composition in
--              src/store/redis/scripts.rs, around the parts: they only see a lower `cost`)
-- Joint        a joint acquire (the Envoy descriptors of one request: src/service/joint.rs)
--              decides the limits of several subjects at once, each with its own cost: ARGV[1]
--              is 0, and each limit's cost comes just before its parameters (the part reads it
--              as `cost`; `a` still points just before the parameters)
-- Reply        {allowed (0|1), then for each limit in policy order: units, remaining,
--              reset_after_us, retry_after_us; then now; then, for an acquire or a report, each
--              limit's refund count}. `units` is whether the limit admits (0|1) for an acquire
--              or a peek, the units recorded for a report, the units given back for a refund.
--              `now` is the decision's time in µs. A refund count (`out_refunded`, set by a
--              take or a report of a token bucket or GCRA, 0 otherwise) is what the ticket
--              keeps: the units refunds have given back since the subject was last at rest.
-- Queue        every operation but a reservation's own take reads the subject's queue of
--              reservations, `<prefix>:{<policy>:<key>}:queue` (lua/reserve.lua), named from
--              the tag its state keys open with (each part's own, in a joint acquire). While it
--              is ahead of now, the operation is decided as src/limiter/reservation.rs
--              (decide_queued) decides it: at the queue's time, its reply's times measured from
--              now, and an acquire or a peek denied by every limit with the wait for the queue
--              plus the limit's own wait from there; the reply of a report or a refund so
--              moved ends with one number more, the time it was decided at (µs)
-- Flags        `#!lua`: refused whole, with OOM, while Redis is over maxmemory; a peek's script
--              is `#!lua flags=no-writes` and is called with EVALSHA_RO
--
-- One limit's part has five sections, split by the lines `--- take`, `--- keep`, `--- report`
-- and `--- refund`:
-- - the level: reads the limit's state from `key` (KEYS[i]) and its parameters from ARGV[a + n],
--   works out where the subject stands at `now`, and sets `admits` (whether `cost` fits). It
--   writes nothing at all, so that a peek is a read-only script.
-- - take (acquire, when every limit admits): takes `cost`, writes the state with its expiry,
--   and sets `out_remaining` and `out_reset` (`out_retry` stays 0).
-- - keep (acquire otherwise, and peek): writes nothing, and sets `out_remaining`, `out_reset`
--   and, when the limit does not admit, `out_retry`: the subject as it stands.
-- - report: takes `cost` whether it fits or not, but never past twice the quota of usage, writes
--   the state with its expiry, and sets `out_units` (units recorded), `out_remaining` (never
--   negative), `out_reset` and `out_retry` (the time until one unit is available; 0 when
--   `out_remaining` >= 1).
-- - refund: gives back at most `cost` units (within `mark` when it is set), never above the full
--   quota and never to a subject without state; writes without moving the expiry (SET ...
--   KEEPTTL); sets `out_units` (units given back), and `out_remaining`, `out_reset` and
--   `out_retry` as report does.
-- A part that reads its state, one string, into `raw` with a plain GET of `key` (the exact line
-- is GET_STATE in src/store/redis/scripts.rs) has that line replaced, in a script of several such
-- parts, by `local raw = raws[n]`, all of them read by one MGET before the first part: one call
-- to Redis instead of one per limit. MGET answers nil for a key of another type, where GET fails
-- with WRONGTYPE: a state the MGET found missing is read again with GET, so that every script
-- fails on a key of the wrong type as the one-limit script does, before anything is written,
-- and never overwrites a key it did not write.
--
-- The parts nest, each inside the one before (`do ... end`), so that every level runs before
-- any take or keep, each part's locals stay its own, and the script stays straight-line code.
-- An acquire's script:
--
--   local allowed, reply = true, {1, 0, 0, 0, 0, ..., now}
--   do local key, a = KEYS[1], 2           -- limit 1
--     <level 1>; if not admits then allowed = false end
--     do local key, a = KEYS[2], 2 + n1    -- limit 2
--       <level 2>; if not admits then allowed = false end
--       local out_remaining, out_reset, out_retry, out_units = 0, 0, 0, 0
--       if allowed then <take 2> else <keep 2> end
--       reply[6], reply[7], reply[8], reply[9] = ...
--     end
--     ... the same for limit 1, whose locals are in scope again
--   end
--   return reply
--
-- A peek's runs <keep i> alone, a report's <report i>, a refund's <refund i>.
--
-- Lua numbers are doubles: integers are exact only below 2^53 (9007199254740992). Times are
-- microseconds (about 1.7e15 today), so every value stays exact as long as products are formed
-- through muldiv (lua/muldiv.lua). A timestamp handed back to Redis goes through
-- string.format('%d'), never tostring: Redis before 7 prints numbers with 14 digits, which
-- would corrupt a 16-digit timestamp (TTLs in ms have at most 13 and pass as numbers).

local MAX_WAIT_US = 1125899906842624 -- 2^50 µs; longer waits are reported as this
-- µs added to the expiry a take or a report writes: 0, or how far after now it is decided (a
-- booking's delay, lua/reserve.lua, or the subject's queue, below), while Redis's expiries run
-- from now
local take_delay_us = 0

local cost = tonumber(ARGV[1])
-- The decision time, `now` in µs: Redis's own clock, so that every service instance shares one,
-- or the explicit time that tests pass. (Straight-line code rather than a function: each
-- function is a closure created on every call, which measurably costs in a script this short.)
local now = ARGV[2]
if now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(now)
end
