-- Shared helpers for the mq wrk scripts (bench/lua/*.lua).
--
-- Each wrk thread runs its own Lua state; counters live in the global table
-- `stats` of that state, and done() (main state) sums them over the threads
-- registered in setup(). Parameters come from environment variables set by
-- bench/run.py (MQB_QUEUE, MQB_BODY_BYTES, MQB_QUOTA, MQB_THREADS), so the
-- scripts do not depend on how wrk passes arguments after the URL.
-- done() prints one line "MQBENCH_JSON {...}" on stdout; bench/run.py parses it.

local ffi = require("ffi")
ffi.cdef([[
typedef struct { long tv_sec; long tv_nsec; } mqb_timespec;
int clock_gettime(int clk_id, mqb_timespec *tp);
]])
local CLOCK_MONOTONIC = 1
local ts = ffi.new("mqb_timespec")

local M = {}

M.threads = {}

-- Per-method latency histograms of this thread, kept in the thread's flat
-- `stats` table as stats["lat_<method>_<b>"] = count, where bucket b holds
-- latencies in [1.05^b, 1.05^(b+1)) microseconds (5% wide). Flat on purpose:
-- wrk 4.1's thread:get() mis-copies nested tables (script_copy_value pops
-- one value too many), so each thread exposes exactly one flat table.
local BUCKET = math.log(1.05)
local started_us = 0

function M.now_us()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

-- Call in request(): the request is about to be written.
function M.begin()
  started_us = M.now_us()
end

-- Call in response(): record the latency of the request that just completed.
function M.record(stats, method)
  local us = M.now_us() - started_us
  if us < 1 then
    us = 1
  end
  local key = "lat_" .. method .. "_" .. math.floor(math.log(us) / BUCKET)
  stats[key] = (stats[key] or 0) + 1
  return us
end

-- Count an event under "<what>_at_<epoch second>" (the drain lines up stalls
-- and empty receives with vmstat's clock through these).
function M.count_at(stats, what)
  local key = what .. "_at_" .. os.time()
  stats[key] = (stats[key] or 0) + 1
end

local function hist_summary(h)
  local buckets, total = {}, 0
  for b, n in pairs(h) do
    table.insert(buckets, tonumber(b))
    total = total + n
  end
  table.sort(buckets)
  local function pct(p)
    local want, seen = total * p / 100, 0
    for _, b in ipairs(buckets) do
      seen = seen + h[b]
      if seen >= want then
        return math.floor(math.exp((b + 0.5) * BUCKET))
      end
    end
    return 0
  end
  return { count = total, p50 = pct(50), p90 = pct(90), p99 = pct(99), p999 = pct(99.9), max = pct(100) }
end

function M.env(name, default)
  local v = os.getenv(name)
  if v == nil or v == "" then
    return default
  end
  return v
end

M.queue = M.env("MQB_QUEUE", "bench")
M.messages_path = "/" .. M.queue .. "/messages"

-- A 1 KiB (MQB_BODY_BYTES) body of printable bytes.
function M.body()
  local n = tonumber(M.env("MQB_BODY_BYTES", "1024"))
  local pattern = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_"
  local reps = math.floor(n / #pattern) + 1
  return string.sub(string.rep(pattern, reps), 1, n)
end

-- Messages per batch request (MQB_BATCH, default 10: SQS's and mq's limit).
M.batch = tonumber(M.env("MQB_BATCH", "10"))

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

-- Standard base64 (RFC 4648, with padding) of a Lua string.
function M.base64(data)
  local out = {}
  for i = 1, #data, 3 do
    local a, b, c = string.byte(data, i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    local c1 = math.floor(n / 262144) % 64
    local c2 = math.floor(n / 4096) % 64
    local c3 = math.floor(n / 64) % 64
    local c4 = n % 64
    out[#out + 1] = string.sub(B64, c1 + 1, c1 + 1) .. string.sub(B64, c2 + 1, c2 + 1)
      .. (b and string.sub(B64, c3 + 1, c3 + 1) or "=") .. (c and string.sub(B64, c4 + 1, c4 + 1) or "=")
  end
  return table.concat(out)
end

-- JSON string literal of a string made of printable ASCII (escapes " and \ only).
function M.json_string(s)
  return '"' .. string.gsub(s, '["\\]', "\\%0") .. '"'
end

-- Number of times a literal substring occurs in text.
function M.occurrences(text, needle)
  local n, from = 0, 1
  while true do
    local i = string.find(text, needle, from, true)
    if i == nil then
      return n
    end
    n = n + 1
    from = i + #needle
  end
end

-- Main state: remember each thread; give it its index (1-based) and its share
-- of MQB_QUOTA (total number of successful requests wanted; 0 = unlimited).
function M.setup(thread)
  table.insert(M.threads, thread)
  local index = #M.threads
  thread:set("thread_index", index)
  local total = tonumber(M.env("MQB_QUOTA", "0"))
  local nthreads = tonumber(M.env("MQB_THREADS", "1"))
  local quota = 0
  if total > 0 then
    quota = math.floor(total / nthreads)
    if index <= total % nthreads then
      quota = quota + 1
    end
    if quota == 0 then
      quota = -1 -- this thread has nothing to do: stop at once
    end
  end
  thread:set("quota", quota)
end

-- Header lookup that does not depend on the server's header-name case.
function M.header(headers, name)
  local v = headers[name]
  if v ~= nil then
    return v
  end
  local lname = string.lower(name)
  for k, val in pairs(headers) do
    if string.lower(k) == lname then
      return val
    end
  end
  return nil
end

function M.count(stats, key)
  stats[key] = (stats[key] or 0) + 1
end

local function encode(v)
  local t = type(v)
  if t == "table" then
    local parts = {}
    for k, val in pairs(v) do
      table.insert(parts, string.format("%q", tostring(k)) .. ":" .. encode(val))
    end
    table.sort(parts)
    return "{" .. table.concat(parts, ",") .. "}"
  elseif t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      return "null"
    end
    if v == math.floor(v) and math.abs(v) < 1e15 then
      return string.format("%d", v)
    end
    return string.format("%.6f", v)
  elseif t == "boolean" then
    return tostring(v)
  elseif t == "nil" then
    return "null"
  end
  return string.format("%q", tostring(v))
end
M.encode = encode

-- Main state: sum the threads' counters and print the wrk summary as JSON.
function M.done(summary, latency, requests)
  local counts, merged = {}, {}
  for _, t in ipairs(M.threads) do
    local s = t:get("stats")
    if s ~= nil then
      for k, v in pairs(s) do
        local method, b = string.match(k, "^lat_([a-z]+)_(-?[0-9]+)$")
        if method ~= nil then
          local m = merged[method] or {}
          merged[method] = m
          b = tonumber(b)
          m[b] = (m[b] or 0) + v
        else
          counts[k] = (counts[k] or 0) + v
        end
      end
    end
  end
  local per_method = {}
  for method, h in pairs(merged) do
    per_method[method] = hist_summary(h)
  end
  local lat = {
    min = 0, max = 0, mean = 0, stdev = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0,
  }
  if summary.requests > 0 then
    lat = {
      min = latency.min,
      max = latency.max,
      mean = latency.mean,
      stdev = latency.stdev,
      p50 = latency:percentile(50),
      p90 = latency:percentile(90),
      p99 = latency:percentile(99),
      p999 = latency:percentile(99.9),
    }
  end
  local out = {
    duration_us = summary.duration,
    requests = summary.requests,
    bytes = summary.bytes,
    errors = summary.errors,
    latency_us = lat,
    threads = #M.threads,
    counts = counts,
    per_method_latency_us = per_method,
  }
  io.write("MQBENCH_JSON " .. encode(out) .. "\n")
  io.flush()
end

return M
