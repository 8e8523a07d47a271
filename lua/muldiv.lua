-- muldiv.lua: exact a * b / c, prepended after common.lua to the scripts whose products can
-- exceed 2^53 (see the registry in src/limiter/mod.rs). It has no KEYS, ARGV or reply of its own.
--
-- One function that names no local of the script (2^53 written as a literal, the division by c
-- written out): a closure without upvalues, whose creation on every call of the script costs
-- next to nothing, where a function naming locals costs an upvalue made and closed per local
-- on every call (muldiv naming a divmod helper and a TWO_53 local cost about 0.1 us a call).

-- floor(a * b / c) and (a * b) mod c for a, c below 2^53 and b below 2^31, exact even when
-- a * b is not. Quotients of 2^53 or more come back approximate, and are only ever compared with
-- far smaller numbers or capped at MAX_WAIT_US. With b = 1 it is floor(a / c) and a mod c.
--
-- Below 2^53, math.floor of the rounded quotient is the exact quotient or one above it (a / c
-- may round up to the next integer when c is large, never below the exact quotient), and in the
-- second case the remainder comes out negative.
local function muldiv(a, b, c)
  local p = a * b
  if p < 9007199254740992 then
    local q = math.floor(p / c)
    local r = p - q * c
    if r < 0 then
      return q - 1, r + c
    end
    return q, r
  end
  local aq = math.floor(a / c)
  local ar = a - aq * c
  if ar < 0 then
    aq, ar = aq - 1, ar + c
  end
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
