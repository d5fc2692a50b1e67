-- turnstile: GCRA in integer microseconds, atomic in Redis.
-- The contract (argument meanings, reply, why microseconds) is in
-- src/redis/script.rs; the algorithm is src/algorithms/gcra.rs, term for term.
--
-- One call decides k >= 1 requests, in order, at one `now`: a single check
-- is k = 1, a batch is its keys (on a Cluster, those of one hash slot). A
-- key named twice is charged twice, the second time on the TAT the first
-- wrote.
--
-- KEYS[i]      the bucket of request i; its value is TAT, microseconds on
--              the time scale of ARGV[3], written as a decimal integer
-- ARGV[1]      T, the emission interval in microseconds (>= 1), or '' when
--              each request brings its own T and tau (requests on several
--              limits: RedisLimiter::check_each)
-- ARGV[2]      tau = B * T in microseconds ('' with ARGV[1] = '')
-- ARGV[3]      now in microseconds, or '' to read the server's TIME
-- ARGV[2i+2]   n_i, the cost of request i (1 <= n_i <= B), or 0 for a look:
--              nothing is taken or written, granted_i is 0 and tat_i tells
--              the caller what a check would find
-- ARGV[2i+3]   want_i (n_i <= want_i <= B): tokens to take if available,
--              n_i otherwise
--   With ARGV[1] = '', request i takes four: ARGV[4i], ARGV[4i+1] are n_i
--   and want_i, ARGV[4i+2], ARGV[4i+3] its T and tau.
-- Reply        {now, granted_1, tat_1, ..., granted_k, tat_k}: now = the
--              time used; granted_i = 0 for a denial, else the tokens taken
--              (n_i <= granted_i <= want_i); tat_i = the stored TAT before
--              request i (0 when missing).

local each = ARGV[1] == ''
local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[3])
end

local reply = {now}
for i = 1, #KEYS do
  local n, want
  if each then
    n = tonumber(ARGV[4 * i])
    want = tonumber(ARGV[4 * i + 1])
    t = tonumber(ARGV[4 * i + 2])
    tau = tonumber(ARGV[4 * i + 3])
  else
    n = tonumber(ARGV[2 * i + 2])
    want = tonumber(ARGV[2 * i + 3])
  end
  local stored = redis.call('GET', KEYS[i])
  local tat = 0
  if stored then
    -- A value that is not a number (not written by this script) counts as
    -- a full bucket, and is overwritten by the next admission.
    tat = tonumber(stored) or 0
  end

  -- A missing bucket and TAT <= now are the same thing: full.
  local base = math.max(tat, now)
  local room = tau - (base - now)
  -- Whole tokens that fit in room. The quotient is a rounded double:
  -- correct it so that take * t <= room holds exactly (both sides are
  -- exact integers).
  local take = math.floor(room / t)
  if take * t > room then
    take = take - 1
  end
  if take > want then
    take = want
  end
  if n == 0 or take < n then
    take = 0
  else
    local next = base + take * t
    -- string.format('%d') writes every digit; tostring would round to 14.
    redis.call('SET', KEYS[i], string.format('%d', next))
    -- The bucket is full again at `next`: after that a missing key decides
    -- the same, so idle users cost Redis nothing.
    redis.call('PEXPIRE', KEYS[i], string.format('%d', math.ceil((next - now) / 1000)))
  end
  reply[2 * i] = take
  reply[2 * i + 1] = tat
end
return reply
