-- Arguments and replies travel as one "framed" string each: a 4-byte big-endian length
-- before every field (streams.groups.frame / unframe are the Python side). Packing and
-- parsing tens of thousands of separate Redis arguments and reply items in redis-py costs
-- more CPU than the whole rest of the stage.
local function unframe(blob)
  local out, pos, n = {}, 1, #blob
  while pos <= n do
    local len
    len, pos = struct.unpack('>I4', blob, pos)
    out[#out + 1] = string.sub(blob, pos, pos + len - 1)
    pos = pos + len
  end
  return out
end
local function frame(list)
  local parts = {}
  for i = 1, #list do
    local s = tostring(list[i])
    parts[#parts + 1] = struct.pack('>I4', #s)
    parts[#parts + 1] = s
  end
  return table.concat(parts)
end
