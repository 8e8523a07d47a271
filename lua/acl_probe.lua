-- acl_probe.lua: tries, at start-up, each command the service's scripts call, so that a Redis
-- user whose ACL lacks one is refused start-up naming it (src/store/redis/acl.rs) instead of
-- failing every decision later. A command the ACL allows may still fail here (wrong type, out
-- of memory): only a refusal by the ACL is reported. It leaves nothing behind: the probe keys
-- are deleted at the end.
--
-- KEYS[1..4]: the probe keys <prefix>:{probe}:z, :h, :s and :k, on one hash tag (one slot) that
-- no state, lease, policy or top key shares.
-- ARGV: one entry per command: its name, the number of its arguments N, then N arguments, of
-- which `@<i>` stands for KEYS[i].
-- Reply: a flat array of name, refusal pairs, one per command the ACL refused (empty if none).

local refused = {}
local i = 1
while i <= #ARGV do
  local name = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  local args = {}
  for j = 1, n do
    local a = ARGV[i + 1 + j]
    local k = string.match(a, '^@(%d)$')
    if k then
      a = KEYS[tonumber(k)]
    end
    args[j] = a
  end
  i = i + 2 + n
  local reply = redis.pcall(name, unpack(args))
  if type(reply) == 'table' and reply.err then
    local e = reply.err
    if string.find(e, "can't run", 1, true) or string.find(e, "can't access", 1, true)
        or string.find(e, 'NOPERM', 1, true) then
      refused[#refused + 1] = name
      refused[#refused + 1] = e
    end
  end
end
redis.pcall('del', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return refused
