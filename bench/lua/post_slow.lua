-- wrk script: post.lua's durable sends (loaded as they are), plus the start (CLOCK_MONOTONIC,
-- µs) and the latency of every send slower than MQB_SLOW_US (default 5,000) as counts
-- "slow_<start µs>" = <latency µs> (bench/lone_tail.py lines them up with its samples).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "post.lua")
local mq = require("mqbench")
local slow_us = tonumber(mq.env("MQB_SLOW_US", "5000"))
local post_request, post_response = request, response

function request()
  mq.begin()
  return post_request()
end

function response(status, headers, body)
  local us = mq.record(stats, "post")
  if us >= slow_us then
    stats["slow_" .. string.format("%d", mq.now_us() - us)] = math.floor(us)
  end
  post_response(status, headers, body)
end
