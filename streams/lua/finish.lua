-- GroupStore.finish (after framing.lua): done markers, clean-up, output position.
-- ARGV = [prefix, ttl, framed(per group: group_id, partition, kind, output partition, offset or -1)]
local prefix, ttl, f = ARGV[1], ARGV[2], unframe(ARGV[3])
for i = 1, #f, 5 do
  local gid, part, offset = f[i], f[i + 1], tonumber(f[i + 4])
  redis.call('SET', prefix .. 'done:' .. gid, f[i + 2], 'EX', ttl)
  redis.call('DEL', prefix .. 'g:' .. gid, prefix .. 'out:' .. gid, prefix .. 'wm:' .. gid)
  redis.call('SREM', prefix .. 'ready:' .. part, gid)
  redis.call('ZREM', prefix .. 'dl:' .. part, gid)
  if offset >= 0 then
    local pos = prefix .. 'outpos:' .. f[i + 3]
    if offset > tonumber(redis.call('GET', pos) or '-1') then redis.call('SET', pos, offset) end
  end
end
return #f / 5
