-- batch.lua: several one-limit decisions in one script call, each as atomic and as exact as
-- its own script call, in order, the batch itself atomic. src/store/redis/batch.rs sends it for the
-- decisions that were waiting while an earlier call of the same thread was at Redis;
-- src/store/redis/scripts.rs puts it together: this file, with the helpers (lua/muldiv.lua) where
-- `--- helpers` stands, and, where `--- functions` stands, one branch per operation (acquire,
-- report, refund) and algorithm that defines the decision's function: the one-limit script of
-- that operation and algorithm (lua/common.lua and the algorithm's part) as a function of its
-- key and of the offset `o` of its arguments in ARGV (its KEYS[1] read as `key`, its ARGV[i] as
-- ARGV[o + i]). A function is created only when a batch holds such a decision.
--
-- KEYS[j]      the j-th decision's state key, on one Redis; none on a Cluster (see below)
-- ARGV[1]      the number of decisions n
-- ARGV[2...]   for each decision in order: its state key when no KEYS are given, its function's
--              number (batch_code in scripts.rs), the number m of its arguments, then its m
--              arguments, laid out as lua/common.lua lays out a one-limit script's ARGV (cost,
--              time or empty, parameters, a refund's mark)
-- Reply        one entry per decision, in order: the reply its own script would give
--              (lua/common.lua), or, if it raised an error, that error as a string
-- Flags        `#!lua`, like every decision script, on one Redis. On a Cluster the keys of a
--              batch are in several slots of one master, which Redis lets a call declare in
--              KEYS only if they share one slot (else CROSSSLOT, whatever the flags): there the
--              keys come in ARGV, the call is sent to the master of the first key's slot, and
--              the script is flagged `#!lua flags=allow-cross-slot-keys`. A key the node does
--              not serve (a slot that just moved) fails its decision alone, with Redis's "non
--              local key" error, and src/store/redis/batch.rs sends that decision again by itself.
--
-- Every decision given no time of its own (an empty ARGV[2]) takes one reading of Redis's
-- clock, the batch's: they run one after the other inside one script, where no other client
-- can come between them, so they are decisions made in the same microsecond. Each runs under
-- pcall: a decision that raises an error (a state key of the wrong type, say) answers that
-- error and leaves the others theirs, as separate calls would.
--- helpers

local reply, functions, now = {}, {}, nil
local declared, at = #KEYS > 0, 2
for j = 1, tonumber(ARGV[1]) do
  local key
  if declared then
    key = KEYS[j]
  else
    key, at = ARGV[at], at + 1
  end
  local code, m = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local f = functions[code]
  if not f then
  --- functions
    functions[code] = f
  end
  -- The decision's arguments are ARGV[at + 2 ...]: its function reads them in place, and its
  -- time, when it has none, is the batch's.
  if ARGV[at + 3] == '' then
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    ARGV[at + 3] = now
  end
  local ok, r = pcall(f, key, at + 1)
  if not ok then
    if type(r) == 'table' then
      r = r.err
    end
    r = tostring(r)
  end
  reply[j] = r
  at = at + 2 + m
end
return reply
