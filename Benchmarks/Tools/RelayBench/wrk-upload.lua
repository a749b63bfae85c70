-- Each connection: its own family (registered by its first request) and source, sequences 1, 2, 3...
local counter = 0
local function uuid_bytes()
  local t = {}
  for i = 1, 16 do t[i] = string.char(math.random(0, 255)) end
  return table.concat(t)
end
local function hex(s) return (s:gsub('.', function(c) return string.format('%02x', string.byte(c)) end)) end
local function uuid_text(b)
  local h = hex(b)
  return h:sub(1,8)..'-'..h:sub(9,12)..'-'..h:sub(13,16)..'-'..h:sub(17,20)..'-'..h:sub(21,32)
end
local function le64(n)
  local t = {}
  for i = 1, 8 do t[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(t)
end
function init(args)
  math.randomseed(os.time() + math.floor(os.clock() * 1e6) + tonumber(tostring({}):match("0x(%x+)"), 16) % 100000)
  families = {}
  for i = 1, 128 do families[i] = {family = uuid_bytes(), source = uuid_bytes(), seq = 0} end
  token = hex(uuid_bytes() .. uuid_bytes())
  turn = 0
  filler = string.rep("x", 12 + 200 + 16)
end
function request()
  turn = turn % #families + 1
  local f = families[turn]
  f.seq = f.seq + 1
  local seq, family, source = f.seq, f.family, f.source
  local body = "STSR" .. string.char(1, 1, 1) .. family .. source .. le64(seq) .. le64(seq) .. le64(200) .. string.char(0) .. filler
  local path = "/v1/families/" .. uuid_text(family) .. "/sites/" .. uuid_text(source) .. "/deltas?from=" .. seq .. "&to=" .. seq .. "&full=0&current=999999999"
  return wrk.format("POST", path, {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/octet-stream"}, body)
end
local statuses = {}
function response(status, headers, body)
  if status ~= 201 then counter = counter + 1 end
end
function done(summary, latency, requests)
  io.write(string.format("non-2xx: %d\n", summary.errors.status))
end
