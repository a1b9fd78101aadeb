local text = string.rep("message 1 ", 20)
local n = 0
local sessions = tonumber(os.getenv("SESSIONS") or "1000")
request = function()
  n = n + 1
  local body = '{"model":"mock","stream":false,"messages":[{"role":"user","content":"' .. text .. n .. '"}]}'
  return wrk.format("POST", "/v1/chat/completions", {["content-type"]="application/json", ["authorization"]="Bearer sk-bench", ["x-session-id"]="s-" .. (n % sessions)}, body)
end
