-- wrk script for a GET endpoint (/healthz, the HTTP stack's ceiling); prints the same JSON line
-- as acquire.lua.

function done(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d}\n',
    summary.requests, summary.duration, errors, summary.errors.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
