-- wrk script: post.lua's durable sends, plus the start (CLOCK_MONOTONIC, µs) and the
-- latency of every send slower than MQB_SLOW_US (default 5,000) as counts
-- "slow_<start µs>" = <latency µs> (bench/lone_tail.py lines them up with its samples).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local mq = require("mqbench")

stats = { sent = 0 }
local req
local slow_us = tonumber(mq.env("MQB_SLOW_US", "5000"))

function setup(thread)
  mq.setup(thread)
end

function init(args)
  req = wrk.format("POST", mq.messages_path, { ["Content-Type"] = "application/octet-stream" }, mq.body())
end

function request()
  mq.begin()
  return req
end

function response(status, headers, body)
  local us = mq.record(stats, "post")
  mq.count(stats, "post_" .. status)
  if status == 201 then
    stats.sent = stats.sent + 1
  end
  if us >= slow_us then
    stats["slow_" .. string.format("%d", mq.now_us() - us)] = math.floor(us)
  end
end

function done(summary, latency, requests)
  mq.done(summary, latency, requests)
end
