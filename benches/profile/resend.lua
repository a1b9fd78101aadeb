local text = string.rep("message 1 ", 20)
local msgs = {}
for i = 1, 20 do
  local role = (i % 2 == 1) and "user" or "assistant"
  msgs[#msgs+1] = '{"role":"' .. role .. '","content":"' .. text .. i .. '"}'
end
local hist = table.concat(msgs, ",")
local n = 0
request = function()
  n = n + 1
  local body = '{"model":"mock","stream":false,"messages":[' .. hist .. ',{"role":"user","content":"' .. text .. n .. '"}]}'
  return wrk.format("POST", "/v1/chat/completions", {["content-type"]="application/json", ["authorization"]="Bearer sk-bench"}, body)
end
