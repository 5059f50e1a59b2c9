-- wrk script: receive + delete. GET /<queue>/messages; after a 200 the next
-- request on this connection is DELETE /<queue>/messages/<X-Message-Id>.
-- The state is per Lua state = per wrk thread, so run one connection per
-- thread (wrk -t N -c N). A cycle counts when the DELETE answers 200.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local mq = require("mqbench")

stats = { cycles = 0, received = 0, empty = 0, missing_id = 0 }
quota = 0
local pending_id = nil -- message id to delete next
local last = nil -- method of the request in flight
local get_req
-- A request slower than this (microseconds) is counted per second it ended in.
local SLOW_US = 200000

function setup(thread)
  mq.setup(thread)
end

function init(args)
  get_req = wrk.format("GET", mq.messages_path)
end

function request()
  mq.begin()
  if pending_id ~= nil then
    last = "delete"
    return wrk.format("DELETE", mq.messages_path .. "/" .. pending_id)
  end
  last = "get"
  return get_req
end

function response(status, headers, body)
  if mq.record(stats, last) >= SLOW_US then
    mq.count_at(stats, "slow_" .. last)
  end
  mq.count(stats, last .. "_" .. status)
  if last == "get" then
    if status == 200 then
      stats.received = stats.received + 1
      pending_id = mq.header(headers, "X-Message-Id")
      if pending_id == nil then
        stats.missing_id = stats.missing_id + 1
      end
    elseif status == 204 then
      stats.empty = stats.empty + 1
      mq.count_at(stats, "empty")
    end
  else
    pending_id = nil
    if status == 200 then
      stats.cycles = stats.cycles + 1
    end
  end
end

function done(summary, latency, requests)
  mq.done(summary, latency, requests)
end
