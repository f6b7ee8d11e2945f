-- wrk script: POST the JSON body in $BODY on every request, and print one machine-readable line
-- with the latency percentiles in microseconds (wrk's HdrHistogram, finer than its text report).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("BODY"), "rb"))
wrk.body = f:read("*a")
f:close()

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %d, "errors": %d, "non2xx": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d}\n',
    summary.requests, e.connect + e.read + e.write + e.timeout, e.status, summary.duration,
    latency:percentile(50), latency:percentile(99)))
end
