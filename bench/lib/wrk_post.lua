-- wrk script of lib/load.py post_with_wrk (copied into the run's work folder, whose path is its argument).
-- Each thread (one connection) sends its own precomputed, signed, unique requests.
local threads = {}
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local reqs = {}
local counter = 0
-- Globals, not locals: done() reads them with thread:get().
s202, s200, sother, exhausted, ranout = 0, 0, 0, 0, 0
local fallback = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

function init(args)
  local dir = args[1]
  local f = assert(io.open(dir .. "/req-" .. id .. ".bin", "rb"))
  local data = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #data do
    local nl = data:find("\n", pos, true)
    local len = tonumber(data:sub(pos, nl - 1))
    reqs[#reqs + 1] = data:sub(nl + 1, nl + len)
    pos = nl + len + 1
  end
  marker = dir .. "/done-" .. id
  stopfile = dir .. "/stop"
end

local function finish(ran_out)
  if ran_out and exhausted == 0 then ranout = 1 end
  if exhausted == 0 then
    exhausted = 1
    local m = io.open(marker, "w")
    if m then m:write("done") m:close() end
    wrk.thread:stop()
  end
end

function request()
  counter = counter + 1
  if counter > #reqs then
    finish(true)
    return fallback
  end
  return reqs[counter]
end

function response(status, headers, body)
  if counter > #reqs then return end  -- the answer to the harmless fallback
  if status == 202 then s202 = s202 + 1
  elseif status == 200 then s200 = s200 + 1
  else sother = sother + 1 end
  if counter >= #reqs then
    finish(true)
  else
    -- Duration mode: the benchmark creates this file when the time is up; stopping here, after
    -- a whole answer, leaves no request in flight, so 202 answers and stored rows can be compared.
    local f = io.open(stopfile, "r")
    if f then f:close() finish(false) end
  end
end

function done(summary, latency, requests)
  local a, b, c, e = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    a = a + (t:get("s202") or 0)
    b = b + (t:get("s200") or 0)
    c = c + (t:get("sother") or 0)
    e = e + (t:get("ranout") or 0)
  end
  local er = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "s202": %d, "s200": %d, "sother": %d, "exhausted": %d, ' ..
    '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %f}\n',
    summary.requests, summary.duration, a, b, c, e, er.connect, er.read, er.write, er.status, er.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
