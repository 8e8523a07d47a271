-- common.lua: helpers prepended to every decision script when it is loaded (see
-- src/store/scripts.rs). It has no KEYS, ARGV or reply of its own.
--
-- Lua numbers are doubles: integers are exact only below 2^53 (9007199254740992). Times are
-- microseconds (about 1.7e15 today), so every value below stays exact as long as products are
-- formed through muldiv, and numbers handed back to Redis go through fmt, never tostring (which
-- keeps 14 digits and would corrupt a 16-digit timestamp).

local TWO_53 = 9007199254740992
local MAX_WAIT_US = 1125899906842624 -- 2^50 µs; longer waits are reported as this

-- The decision time: the explicit time passed by tests, or Redis's own clock, so that every
-- service instance shares one clock.
local function clock(explicit)
  if explicit ~= nil and explicit ~= '' then
    return tonumber(explicit)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- An integer as a string of all its digits.
local function fmt(n)
  return string.format('%d', n)
end

-- floor(a / c) and a mod c, exact for integers below 2^53 (a / c may round up to the next
-- integer when c is large).
local function divmod(a, c)
  local q = math.floor(a / c)
  local r = a - q * c
  if r < 0 then
    q, r = q - 1, r + c
  elseif r >= c then
    q, r = q + 1, r - c
  end
  return q, r
end

-- floor(a * b / c) and (a * b) mod c for a, c below 2^53 and b below 2^31, exact even when
-- a * b is not. Quotients of 2^53 or more come back approximate, and are only ever compared with
-- far smaller numbers or capped at MAX_WAIT_US.
local function muldiv(a, b, c)
  local p = a * b
  if p < TWO_53 then
    return divmod(p, c)
  end
  local aq, ar = divmod(a, c)
  local whole = aq * b
  -- ar * b / c by binary long multiplication over the bits of b; r stays below c.
  local q, r = 0, 0
  local bitv = 1073741824 -- 2^30
  while bitv >= 1 do
    q, r = q * 2, r * 2
    if r >= c then
      q, r = q + 1, r - c
    end
    if b >= bitv then
      b = b - bitv
      r = r + ar
      if r >= c then
        q, r = q + 1, r - c
      end
    end
    bitv = bitv / 2
  end
  return whole + q, r
end
