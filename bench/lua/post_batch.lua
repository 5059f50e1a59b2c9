-- wrk script: POST /<queue>/messages/batch with MQB_BATCH (default 10) messages of
-- 1 KiB (MQB_BODY_BYTES) each, bodies as body_base64 (the JSON wire format of batches).
-- Counts messages, not requests: "sent" = entries listed under "successful" of
-- 200 answers, "failed_entries" = entries under "failed". With MQB_QUOTA (in
-- messages), each thread stops once it has sent its share (used to prefill a queue).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local mq = require("mqbench")

stats = { sent = 0, batches = 0, failed_entries = 0 }
quota = 0
local req

function setup(thread)
  mq.setup(thread)
end

function init(args)
  local b64 = mq.json_string(mq.base64(mq.body()))
  local entries = {}
  for i = 1, mq.batch do
    entries[i] = '{"id":"' .. (i - 1) .. '","body_base64":' .. b64 .. "}"
  end
  local body = '{"messages":[' .. table.concat(entries, ",") .. "]}"
  req = wrk.format("POST", mq.messages_path .. "/batch", { ["Content-Type"] = "application/json" }, body)
end

function request()
  mq.begin()
  return req
end

function response(status, headers, body)
  mq.record(stats, "post")
  mq.count(stats, "post_" .. status)
  if status == 200 then
    local ok = mq.occurrences(body, '"message_id"')
    stats.sent = stats.sent + ok
    stats.batches = stats.batches + 1
    stats.failed_entries = stats.failed_entries + mq.occurrences(body, '"sender_fault"')
    if quota ~= 0 and stats.sent >= quota then
      wrk.thread:stop()
    end
  end
end

function done(summary, latency, requests)
  mq.done(summary, latency, requests)
end
