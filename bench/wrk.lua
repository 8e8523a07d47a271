-- wrk script for bench/run.py (not a Redis script): POST /v1/acquire, or with no arguments a
-- plain GET of the URL (/healthz, the HTTP stack's ceiling).
--   wrk ... -s bench/wrk.lua <url> -- <policy> <keys> [run]
-- <keys> = 1: every request for one hot key; N: a key drawn at random from N subjects;
-- "unique": every request a new subject (for the memory measurement), named after <run> so that
-- successive runs do not repeat each other's subjects.
-- done() prints one JSON line with the throughput and latency percentiles (µs).

local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  if args[1] == nil then
    next_body = nil
    return
  end
  policy = args[1]
  keys = args[2]
  run = args[3] or "0"
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  if keys == "unique" then
    next_body = function()
      counter = counter + 1
      return '{"policy":"' .. policy .. '","key":"r' .. run .. 't' .. id .. '-' .. counter .. '"}'
    end
  elseif tonumber(keys) == 1 then
    local body = '{"policy":"' .. policy .. '","key":"hot"}'
    next_body = function() return body end
  else
    local n = tonumber(keys)
    next_body = function()
      return '{"policy":"' .. policy .. '","key":"k' .. math.random(n) .. '"}'
    end
  end
end

function request()
  if next_body == nil then
    return wrk.format()
  end
  return wrk.format(nil, nil, nil, next_body())
end

function done(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, errors, summary.errors.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
