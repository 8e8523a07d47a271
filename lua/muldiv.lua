-- muldiv.lua: exact a * b / c, prepended after common.lua to the scripts whose products can
-- exceed 2^53 (see the registry in src/limiter/mod.rs). It has no KEYS, ARGV or reply of its own.

local TWO_53 = 9007199254740992

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
