-- turnstile: GCRA in integer microseconds, atomic in Redis.
-- The contract (argument meanings, reply, why microseconds) is in
-- src/redis/script.rs; the algorithm is src/gcra.rs, term for term.
--
-- KEYS[1]  the bucket; its value is TAT, microseconds on the time scale of
--          ARGV[5], written as a decimal integer
-- ARGV[1]  T, the emission interval in microseconds (>= 1)
-- ARGV[2]  tau = B * T in microseconds
-- ARGV[3]  n, the cost (1 <= n <= B)
-- ARGV[4]  want (n <= want <= B): tokens to take if available, n otherwise
-- ARGV[5]  now in microseconds, or '' to read the server's TIME
-- Reply    {granted, tat, now}: granted = 0 for a denial, else the tokens
--          taken (n <= granted <= want); tat = the stored TAT before this
--          call (0 when missing); now = the time used.

local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local now
if ARGV[5] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[5])
end

local stored = redis.call('GET', KEYS[1])
local tat = 0
if stored then
  -- A value that is not a number (not written by this script) counts as
  -- a full bucket, and is overwritten by the next admission.
  tat = tonumber(stored) or 0
end

-- A missing bucket and TAT <= now are the same thing: full.
local base = math.max(tat, now)
local room = tau - (base - now)
-- Whole tokens that fit in room. The quotient is a rounded double: correct
-- it so that take * t <= room holds exactly (both sides are exact integers).
local take = math.floor(room / t)
if take * t > room then
  take = take - 1
end
if take > want then
  take = want
end
if take < n then
  return {0, tat, now}
end

local next = base + take * t
-- string.format('%d') writes every digit; tostring would round to 14.
redis.call('SET', KEYS[1], string.format('%d', next))
-- The bucket is full again at `next`: after that a missing key decides the
-- same, so idle users cost Redis nothing.
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((next - now) / 1000)))
return {take, tat, now}
