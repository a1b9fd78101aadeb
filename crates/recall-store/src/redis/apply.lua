-- One session's writes of one round, all or nothing (see encode.rs).
-- KEYS: the session's meta, messages and late fields.
-- ARGV[1]: the version the meta must hold first ('' for no check; a
--          missing session holds 0), ARGV[2]: the `created_ms` a stored
--          session must have (one ended and started anew under the same
--          id counts from 0 again, and is another session);
-- ARGV[3]: a reason to refuse the whole ('' to go ahead);
-- ARGV[4]: how many batches change the session's data (its version moves
--          by that much), ARGV[5]: how many add late fields;
-- ARGV[6]: the write id the meta must hold with that version ('' for no
--          check), ARGV[7]: this write's id, kept when the version moves;
-- then the ops, each a name and its arguments.
-- Answers {version, late, write id} as the meta then holds them.

-- The write id makes the fence unique: after a failover that lost a
-- write, another replica's next write brings the version back to the
-- number the lost one had, and only the id tells the two apart.
local meta, msgs, late = KEYS[1], KEYS[2], KEYS[3]
local arity = {save = 8, touch = 4, push = 2, set = 2, late = 2, drop = 2, clear = 0, delete = 0}

local function counters()
  local v = redis.call('HMGET', meta, 'version', 'late', 'wid')
  return {tonumber(v[1] or '0'), tonumber(v[2] or '0'), v[3] or ''}
end

if ARGV[3] ~= '' then
  return redis.error_reply(ARGV[3])
end
-- Checked whole before anything is written: a script stopped halfway
-- would leave half its writes.
local i = 8
while i <= #ARGV do
  local n = arity[ARGV[i]]
  if n == nil or i + n > #ARGV then
    return redis.error_reply('recall: malformed write at argument ' .. i)
  end
  i = i + 1 + n
end
if ARGV[1] ~= '' then
  local stored = redis.call('HMGET', meta, 'version', 'created_ms', 'wid')
  local now = tonumber(stored[1] or '0')
  if now ~= tonumber(ARGV[1]) then
    return redis.error_reply('STALE the session is at version ' .. now
      .. ', this replica read ' .. ARGV[1] .. ': another replica changed it')
  end
  if ARGV[6] ~= '' and (stored[3] or '') ~= ARGV[6] then
    return redis.error_reply('STALE the session is at version ' .. now
      .. ' by another write than the one this replica made or read'
      .. ' (a write lost in a failover): another replica changed it')
  end
  if now ~= 0 and stored[2] ~= ARGV[2] then
    return redis.error_reply('STALE the session was ended and started anew'
      .. ' since this replica read it: another replica changed it')
  end
end

i = 8
while i <= #ARGV do
  local op, a, b = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if op == 'save' then
    redis.call('HSET', meta, 'created_ms', a, 'last_active_ms', b, 'turn_id', ARGV[i + 3],
      'first_seq', ARGV[i + 4], 'users', ARGV[i + 5], 'system_messages', ARGV[i + 6],
      'metadata', ARGV[i + 7], 'remembered', ARGV[i + 8])
  elseif op == 'touch' then
    -- Every field a load needs, whatever became of the Save; the
    -- creation time only if missing.
    redis.call('HSETNX', meta, 'created_ms', a)
    redis.call('HSET', meta, 'last_active_ms', b, 'turn_id', ARGV[i + 3], 'first_seq', ARGV[i + 4])
  elseif op == 'push' then
    redis.call('HSET', msgs, a, b)
  elseif op == 'set' then
    if redis.call('HEXISTS', msgs, a) == 1 then
      redis.call('HSET', msgs, a, b)
    end
  elseif op == 'late' then
    if redis.call('HEXISTS', msgs, a) == 1 then
      redis.call('HSET', late, a, b)
    end
  elseif op == 'drop' then
    for seq = tonumber(a), tonumber(b) - 1 do
      redis.call('HDEL', msgs, seq)
      redis.call('HDEL', late, seq)
    end
  elseif op == 'clear' then
    redis.call('DEL', msgs, late)
  elseif op == 'delete' then
    redis.call('DEL', meta, msgs, late)
  end
  i = i + 1 + arity[op]
end

if redis.call('EXISTS', meta) == 1 then
  if ARGV[4] ~= '0' then
    redis.call('HINCRBY', meta, 'version', ARGV[4])
    redis.call('HSET', meta, 'wid', ARGV[7])
  end
  if ARGV[5] ~= '0' then
    redis.call('HINCRBY', meta, 'late', ARGV[5])
  end
end
return counters()
