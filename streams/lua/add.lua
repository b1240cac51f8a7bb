-- GroupStore.add (after framing.lua and group_reply.lua): store a batch of rewards.
-- ARGV = [prefix, framed(per arrival: group_id, rollout_id, group_size, partition, deadline, value)]
-- Reply: framed(duplicates, late, then each group the batch completed, as in group_reply.lua).
local prefix = ARGV[1]
local f = unframe(ARGV[2])
local ready, order, arrived = {}, {}, {}
local duplicates, late = 0, 0
for i = 1, #f, 6 do
  local gid, rid, size, part, deadline, value = f[i], f[i+1], tonumber(f[i+2]), f[i+3], f[i+4], f[i+5]
  local gkey = prefix .. 'g:' .. gid
  if redis.call('EXISTS', prefix .. 'done:' .. gid) == 1 then
    late = late + 1
  else
    if redis.call('HSETNX', gkey, rid, value) == 0 then duplicates = duplicates + 1 end
    arrived[gid .. '/' .. rid] = value
    redis.call('ZADD', prefix .. 'dl:' .. part, 'NX', deadline, gid)
    if redis.call('HLEN', gkey) >= size then
      redis.call('SADD', prefix .. 'ready:' .. part, gid)
      if not ready[gid] then ready[gid] = part; order[#order + 1] = gid end
    end
  end
end
local out = {duplicates, late}
for _, gid in ipairs(order) do reply_group(out, prefix, gid, ready[gid], arrived) end
return frame(out)
