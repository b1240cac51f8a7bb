-- GroupStore.stage (after framing.lua): write each outcome once (SET NX).
-- ARGV = [prefix, ttl, framed(per group: group_id, outcome, output partition or -1)]
-- Reply: framed(per group: "1" if this call staged it else "0", watermark, and the outcome
-- staged earlier, or "" when this call staged it: the caller has those bytes already).
-- The watermark is the highest acknowledged output offset of that partition known when the
-- outcome was first staged: a record produced for it afterwards lies above it.
local prefix, ttl, f, out = ARGV[1], ARGV[2], unframe(ARGV[3]), {}
for i = 1, #f, 3 do
  local key, wm = prefix .. 'out:' .. f[i], prefix .. 'wm:' .. f[i]
  local first = redis.call('SET', key, f[i + 1], 'NX', 'EX', ttl)
  if first then
    redis.call('SET', wm, redis.call('GET', prefix .. 'outpos:' .. f[i + 2]) or '-1', 'EX', ttl)
  end
  out[#out + 1] = first and '1' or '0'
  out[#out + 1] = redis.call('GET', wm) or '-1'
  out[#out + 1] = first and '' or redis.call('GET', key)
end
return frame(out)
