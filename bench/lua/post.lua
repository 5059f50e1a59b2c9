-- wrk script: POST /<queue>/messages with a 1 KiB body (durable sends).
-- Counts 201s as "sent". With MQB_QUOTA, each thread stops after its share of
-- 201s (used to prefill a queue; run one connection per thread for an exact count).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local mq = require("mqbench")

stats = { sent = 0 }
quota = 0
local req

function setup(thread)
  mq.setup(thread)
end

function init(args)
  req = wrk.format("POST", mq.messages_path, { ["Content-Type"] = "application/octet-stream" }, mq.body())
end

function request()
  return req
end

function response(status, headers, body)
  mq.count(stats, "post_" .. status)
  if status == 201 then
    stats.sent = stats.sent + 1
    if quota ~= 0 and stats.sent >= quota then
      wrk.thread:stop()
    end
  end
end

function done(summary, latency, requests)
  mq.done(summary, latency, requests)
end
