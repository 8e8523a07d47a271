-- wrk script for bench/overrides.py (not a Redis script): POST /v1/acquire of one policy for a
-- key drawn at random from N subjects named <prefix>1 .. <prefix>N, so that one run can aim at
-- the subjects that have an override and another at subjects of the same policy that have none.
--   wrk ... -s bench/wrk_keys.lua <url> -- <policy> <prefix> <N>
-- done() prints one JSON line with the throughput and latency percentiles (µs), as bench/wrk.lua
-- does, so that bench/run.py's wrk() reads it.

local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  policy = args[1]
  prefix = args[2]
  n = tonumber(args[3])
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  math.randomseed(os.time() + id)
end

function request()
  local body = '{"policy":"' .. policy .. '","key":"' .. prefix .. math.random(n) .. '"}'
  return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, errors, summary.errors.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
