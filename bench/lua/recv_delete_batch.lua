-- wrk script: batch receive + batch delete.
-- GET /<queue>/messages?max_messages=MQB_BATCH (JSON form); after a 200 that
-- listed messages, the next request on this connection is
-- POST /<queue>/messages/delete with their receipt handles. Counts messages:
-- "received" = messages listed by receives, "cycles" = entries under
-- "successful" of the deletes (a message counts once it is received AND deleted).
-- The state is per Lua state = per wrk thread: run one connection per thread.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local mq = require("mqbench")

stats = {
  cycles = 0, received = 0, receives = 0, empty = 0, deletes = 0, failed_entries = 0, short_batches = 0,
}
quota = 0
local pending = nil -- body of the next delete request, or nil
local last = nil -- "get" or "delete": the request in flight
local get_req

function setup(thread)
  mq.setup(thread)
end

function init(args)
  get_req = wrk.format("GET", mq.messages_path .. "?max_messages=" .. mq.batch)
end

function request()
  mq.begin()
  if pending ~= nil then
    last = "delete"
    return wrk.format("POST", mq.messages_path .. "/delete", { ["Content-Type"] = "application/json" }, pending)
  end
  last = "get"
  return get_req
end

function response(status, headers, body)
  mq.record(stats, last)
  mq.count(stats, last .. "_" .. status)
  if last == "get" then
    if status ~= 200 then
      return
    end
    stats.receives = stats.receives + 1
    local entries = {}
    for handle in string.gmatch(body, '"receipt_handle"%s*:%s*"([^"]*)"') do
      entries[#entries + 1] = '{"id":"' .. #entries .. '","receipt_handle":' .. mq.json_string(handle) .. "}"
    end
    if #entries == 0 then
      stats.empty = stats.empty + 1
      return
    end
    if #entries < mq.batch then
      stats.short_batches = stats.short_batches + 1
    end
    stats.received = stats.received + #entries
    pending = '{"entries":[' .. table.concat(entries, ",") .. "]}"
  else
    pending = nil
    if status == 200 then
      stats.deletes = stats.deletes + 1
      local successful = string.match(body, '"successful"%s*:%s*(%b[])') or ""
      stats.cycles = stats.cycles + mq.occurrences(successful, '"id"')
      stats.failed_entries = stats.failed_entries + mq.occurrences(body, '"sender_fault"')
    end
  end
end

function done(summary, latency, requests)
  mq.done(summary, latency, requests)
end
