-- wrk script: one client's send -> receive -> delete cycles on one queue.
-- POST a 1 KiB message; GET the oldest ready message; DELETE it by its
-- X-Message-Id; repeat. The queue's depth stays where it was prefilled.
-- Per-thread state: run one connection per thread (wrk -t N -c N).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local mq = require("mqbench")

stats = { cycles = 0, sent = 0, received = 0, empty = 0, missing_id = 0 }
quota = 0
local step = "post" -- next request: post, get, delete
local last = nil
local pending_id = nil
local post_req, get_req

function setup(thread)
  mq.setup(thread)
end

function init(args)
  post_req = wrk.format("POST", mq.messages_path, { ["Content-Type"] = "application/octet-stream" }, mq.body())
  get_req = wrk.format("GET", mq.messages_path)
end

function request()
  mq.begin()
  last = step
  if step == "post" then
    return post_req
  elseif step == "get" then
    return get_req
  end
  return wrk.format("DELETE", mq.messages_path .. "/" .. pending_id)
end

function response(status, headers, body)
  mq.record(stats, last)
  mq.count(stats, last .. "_" .. status)
  if last == "post" then
    if status == 201 then
      stats.sent = stats.sent + 1
      step = "get"
    end
  elseif last == "get" then
    if status == 200 then
      stats.received = stats.received + 1
      pending_id = mq.header(headers, "X-Message-Id")
      if pending_id ~= nil then
        step = "delete"
      else
        stats.missing_id = stats.missing_id + 1
        step = "post"
      end
    else
      if status == 204 then
        stats.empty = stats.empty + 1
      end
      step = "post"
    end
  else
    if status == 200 then
      stats.cycles = stats.cycles + 1
    end
    pending_id = nil
    step = "post"
  end
end

function done(summary, latency, requests)
  mq.done(summary, latency, requests)
end
