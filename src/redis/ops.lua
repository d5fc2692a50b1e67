-- turnstile: peek, refund, reset, and several limits on one key, in one
-- atomic call. The contract is in src/redis/ops.rs; the arithmetic is
-- gcra.lua's (and src/algorithms/gcra.rs's), in integer microseconds.
--
-- KEYS[i]      the bucket of limit i (all in one hash slot)
-- ARGV[1]      'check' | 'peek' | 'refund' | 'reset'
-- ARGV[2]      n, the cost (1 <= n <= every limit's burst)
-- ARGV[3]      now in microseconds, or '' to read the server's TIME
-- ARGV[2i+2]   T of limit i, in microseconds
-- ARGV[2i+3]   tau of limit i, in microseconds
-- Reply        {flag, now, tat_1, ..., tat_k}: every TAT as stored before
--              this call (0 when missing), and:
--   check   flag 1 if every limit admits n: all are charged; else 0 and
--           nothing is written (all or nothing, in one script)
--   peek    flag 1 if every limit would admit n; nothing is written
--   refund  flag 1 if any bucket took tokens back: TAT := max(TAT - n*T, now)
--   reset   flag = the number of buckets deleted

local op = ARGV[1]
local n = tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[3])
end

local reply = {0, now}
local tats = {}
for i = 1, #KEYS do
  local stored = redis.call('GET', KEYS[i])
  -- Not a number (not written by turnstile): a full bucket, as in gcra.lua.
  tats[i] = (stored and tonumber(stored)) or 0
  reply[i + 2] = tats[i]
end

if op == 'reset' then
  reply[1] = redis.call('DEL', unpack(KEYS))
  return reply
end

-- Stores `next` as limit i's TAT, expiring when the bucket is full again.
local function store(i, next)
  redis.call('SET', KEYS[i], string.format('%d', next))
  redis.call('PEXPIRE', KEYS[i], string.format('%d', math.ceil((next - now) / 1000)))
end

if op == 'refund' then
  for i = 1, #KEYS do
    local t = tonumber(ARGV[2 * i + 2])
    -- TAT <= now is a full bucket: nothing to give back.
    if tats[i] > now then
      local next = math.max(tats[i] - n * t, now)
      if next > now then
        store(i, next)
      else
        redis.call('DEL', KEYS[i])
      end
      reply[1] = 1
    end
  end
  return reply
end

local all = 1
local nexts = {}
for i = 1, #KEYS do
  local t = tonumber(ARGV[2 * i + 2])
  local tau = tonumber(ARGV[2 * i + 3])
  nexts[i] = math.max(tats[i], now) + n * t
  if nexts[i] - now > tau then
    all = 0
  end
end
reply[1] = all
if op == 'check' and all == 1 then
  for i = 1, #KEYS do
    store(i, nexts[i])
  end
end
return reply
