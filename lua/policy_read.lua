#!lua flags=no-writes
-- policy_read.lua: consistent reads of the policy set (see policy_write.lua for the keys): one
-- policy with its version, or one page of the changes made after a given version. Read-only, so
-- Redis runs it even while out of memory.
--
-- KEYS[1]  <prefix>:{policies}:meta
-- KEYS[2]  <prefix>:{policies}:names
-- KEYS[3]  <prefix>:{policies}:deleted
-- ARGV[1]  'one' or 'changes'
-- ARGV[2]  one: the policy's name; changes: the version already known (0 for everything)
-- ARGV[3]  one: the policy's hash key; changes: the most changes to return
-- ARGV[4]  changes: the prefix of policy hash keys, <prefix>:{policies}:policy:
-- Reply    {generation or false, version, floor, entries...}: one: entries are
--          {name, version, fields} when the policy exists; changes: one {name, version, fields}
--          per policy changed after ARGV[2], oldest change first, where fields is the flat
--          field/value list of the policy's hash, empty for a deleted policy. The page is
--          complete when it holds fewer than ARGV[3] entries; otherwise the next page starts at
--          the version of its last entry.

local meta, names, deleted = KEYS[1], KEYS[2], KEYS[3]
local m = redis.call('HMGET', meta, 'generation', 'version', 'floor')
local reply = {m[1], tonumber(m[2] or '0'), tonumber(m[3] or '0')}

if ARGV[1] == 'one' then
  local version = redis.call('ZSCORE', names, ARGV[2])
  if version then
    reply[4] = {ARGV[2], tonumber(version), redis.call('HGETALL', ARGV[3])}
  end
  return reply
end

local since, page, prefix = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
if since >= reply[2] then
  return reply
end
local from = '(' .. string.format('%d', since)
local live = redis.call('ZRANGEBYSCORE', names, from, '+inf', 'WITHSCORES', 'LIMIT', 0, page)
local dead = redis.call('ZRANGEBYSCORE', deleted, from, '+inf', 'WITHSCORES', 'LIMIT', 0, page)
-- Merge the two by version; versions are unique, each one given to a single change.
local i, j = 1, 1
while #reply - 3 < page and (i < #live or j < #dead) do
  local lv = live[i + 1] and tonumber(live[i + 1])
  local dv = dead[j + 1] and tonumber(dead[j + 1])
  if lv and (not dv or lv < dv) then
    reply[#reply + 1] = {live[i], lv, redis.call('HGETALL', prefix .. live[i])}
    i = i + 2
  else
    reply[#reply + 1] = {dead[j], dv, {}}
    j = j + 2
  end
end
return reply
