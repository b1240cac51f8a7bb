-- GroupStore.load (after framing.lua and group_reply.lua): the open groups' contents.
-- ARGV = [prefix, framed(per group: group_id, partition)]; reply as add.lua's without the counts.
local f, out = unframe(ARGV[2]), {}
for i = 1, #f, 2 do reply_group(out, ARGV[1], f[i], f[i + 1], nil) end
return frame(out)
