-- wrk script: post.lua's durable sends (loaded as they are), plus each send's 201 counted under the epoch
-- second it arrived in, "sent_at_<second>" (os.time(), the clock of the bench's time.time()): the metrics
-- step lines these up with the seconds it scraped in and the seconds it did not (bench/run.py).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "post.lua")
local mq = require("mqbench")
local post_response = response

function response(status, headers, body)
  if status == 201 then
    mq.count_at(stats, "sent")
  end
  post_response(status, headers, body)
end
