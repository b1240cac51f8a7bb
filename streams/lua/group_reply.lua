-- A group in a reply: group_id, partition, state, n, then n fields: for state "R" the
-- rollout_id/value pairs ("" = the value that arrived in this very batch), for "S" the staged
-- outcome and its watermark. Done groups ("D") and empty ones ("E") have their leftovers cleared.
local function reply_group(out, prefix, gid, part, arrived)
  local function head(state, n) out[#out + 1] = gid; out[#out + 1] = part; out[#out + 1] = state; out[#out + 1] = n end
  local function clear() redis.call('SREM', prefix .. 'ready:' .. part, gid); redis.call('ZREM', prefix .. 'dl:' .. part, gid) end
  if redis.call('EXISTS', prefix .. 'done:' .. gid) == 1 then
    clear(); redis.call('DEL', prefix .. 'g:' .. gid); head('D', 0); return
  end
  local staged = redis.call('GET', prefix .. 'out:' .. gid)
  if staged then
    head('S', 2); out[#out + 1] = staged; out[#out + 1] = redis.call('GET', prefix .. 'wm:' .. gid) or '-1'; return
  end
  local items = redis.call('HGETALL', prefix .. 'g:' .. gid)
  if #items == 0 then clear(); head('E', 0); return end
  head('R', #items)
  for i = 1, #items, 2 do
    out[#out + 1] = items[i]
    if arrived and arrived[gid .. '/' .. items[i]] == items[i + 1] then out[#out + 1] = '' else out[#out + 1] = items[i + 1] end
  end
end
