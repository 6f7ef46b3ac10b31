-- penumbra.cuda — the CUDA device (DESIGN §8): on a GPU, or on penumbra's kernel interpreter in a
-- -DPN_CUDA_EMU=ON build. Tensors move with t:to('cuda') / t:to('cpu') or are made there with
-- device = 'cuda'; device memory is counted in C and the Lua GC is run on its pressure too.
local B = require 'penumbra_ffi'
local ffi = require 'ffi'
local C = B.C

local M = {}

function M.available() return C.pn_cuda_available() ~= 0 end
-- true when the CUDA path runs in the kernel interpreter on the CPU (nothing there is timed)
function M.interpreted() return C.pn_cuda_interpreted() ~= 0 end
function M.device_name() return ffi.string(C.pn_cuda_device_name()) end
function M.synchronize() B.check(C.pn_cuda_synchronize()) end
-- f32 matmul in TF32 on the GPU's tensor cores (inputs rounded to 10 mantissa bits, f32 sums:
-- ~1e-3 relative error, several times the speed) when on; off by default. Returns the previous.
function M.allow_tf32(on) return C.pn_cuda_set_tf32(on and 1 or 0) ~= 0 end

-- {allocated, reserved, peak, malloc_calls, free_calls, blocks}: bytes held by tensors, bytes
-- taken from cudaMalloc (the allocator's cache included), the peak of allocated, and the calls
function M.memory_stats()
  local s = ffi.new('pn_cuda_memory_stats')
  B.check(C.pn_cuda_memory_stats_get(s))
  return {
    allocated = tonumber(s.allocated), reserved = tonumber(s.reserved), peak = tonumber(s.peak),
    malloc_calls = tonumber(s.malloc_calls), free_calls = tonumber(s.free_calls), blocks = tonumber(s.blocks),
  }
end
function M.reset_peak() B.check(C.pn_cuda_reset_peak()) end
-- hands the cached, unused blocks back with cudaFree (collect garbage first to drop dead tensors)
function M.empty_cache()
  collectgarbage('collect')
  B.check(C.pn_cuda_empty_cache())
end

-- The interpreter's thread order between barriers: 'fwd', 'rev' or 'rand:SEED'. With an argument
-- it sets the order; it returns the one in force. pn.cuda.with_schedule(s, fn) runs fn under s.
function M.schedule(spec)
  if spec ~= nil then
    if type(spec) ~= 'string' then error('cuda.schedule: expected a string (fwd, rev, rand:SEED)', 2) end
    B.check(C.pn_cuda_emu_schedule(spec))
  end
  return ffi.string(C.pn_cuda_emu_schedule_name())
end

function M.with_schedule(spec, fn)
  local prev = M.schedule()
  M.schedule(spec)
  local ok, err = pcall(fn)
  M.schedule(prev)
  if not ok then error(err, 0) end
end

-- The device memory the interpreter reports and lets cudaMalloc hand out: with bytes (0: its
-- default, 80 GiB) it sets the size; returns the size before and the bytes cudaMalloc has handed
-- out (the allocator's cache included). Makes out-of-memory paths testable.
function M.emu_device_memory(bytes)
  if bytes ~= nil and (type(bytes) ~= 'number' or bytes < 0 or bytes % 1 ~= 0 or bytes > 2 ^ 53) then
    error('cuda.emu_device_memory: expected a whole number of bytes from 0 to 2^53 (0: the default), got ' ..
      tostring(bytes), 2)
  end
  local prev, used = ffi.new('int64_t[1]'), ffi.new('int64_t[1]')
  B.check(C.pn_cuda_emu_device_memory(bytes or -1, prev, used))
  return tonumber(prev[0]), tonumber(used[0])
end

-- The interpreter's planted-bug cases (core/cuda/emu/selftest.cu): true and the case's result
-- values, or false and the interpreter's report.
function M.selftest(name, n)
  n = n or 64
  local out = ffi.new('double[?]', n)
  for i = 0, n - 1 do out[i] = 0 / 0 end
  local st = C.pn_cuda_emu_selftest(name, out, n)
  if st ~= 0 then return false, B.last_error() end
  local vals = {}
  for i = 0, n - 1 do vals[i + 1] = out[i] end
  return true, vals
end

-- m (rows × cols, nested Lua tables) into a new ctype array, row-major; errors name op's argument
local function flat(op, ctype, m, rows, cols, name)
  if type(m) ~= 'table' or #m ~= rows then error(string.format('%s: %s must have %d rows', op, name, rows), 3) end
  local buf = ffi.new(ctype, rows * cols)
  for i = 1, rows do
    if type(m[i]) ~= 'table' or #m[i] ~= cols then
      error(string.format('%s: row %d of %s must have %d numbers', op, i, name, cols), 3)
    end
    for j = 1, cols do buf[(i - 1) * cols + j - 1] = m[i][j] end
  end
  return buf
end
-- a row-major array of rows × cols as nested Lua tables
local function unflat(buf, rows, cols)
  local out = {}
  for i = 1, rows do
    out[i] = {}
    for j = 1, cols do out[i][j] = buf[(i - 1) * cols + j - 1] end
  end
  return out
end

-- One warp's PTX mma.sync m16n8k16 (core/cuda/mma_ptx.cuh): a (16 × 16), b (16 × 8), c (16 × 8)
-- as nested Lua tables (rows), precision 'bf16' (default) or 'f16', load 'registers' (default:
-- each lane packs its registers by the documented layout) or 'ldmatrix' (A and Bᵀ staged in
-- shared memory, the registers loaded by ldmatrix); returns d = a·b + c (16 × 8 rows) as the
-- tensor cores computed it.
function M.mma_check(a, b, c, precision, load)
  precision, load = precision or 'bf16', load or 'registers'
  if precision ~= 'bf16' and precision ~= 'f16' then
    error("cuda.mma_check: precision must be 'bf16' or 'f16', got '" .. tostring(precision) .. "'", 2)
  end
  if load ~= 'registers' and load ~= 'ldmatrix' then
    error("cuda.mma_check: load must be 'registers' or 'ldmatrix', got '" .. tostring(load) .. "'", 2)
  end
  local op = 'cuda.mma_check'
  local fa, fb, fc = flat(op, 'float[?]', a, 16, 16, 'a'), flat(op, 'float[?]', b, 16, 8, 'b'),
    flat(op, 'float[?]', c, 16, 8, 'c')
  local d = ffi.new('float[128]')
  local half, ldm = precision == 'f16' and 1 or 0, load == 'ldmatrix' and 1 or 0
  if C.pn_cuda_mma_check(half, ldm, fa, fb, fc, d) ~= 0 then error(B.last_error(), 2) end
  return unflat(d, 16, 8)
end

-- One warp's PTX mma.sync m8n8k4 .f64 (mma_ptx.cuh's pn_dmma_884, power.cu's tile products): a
-- (8 × 4), b (4 × 8), c (8 × 8) as nested Lua tables (rows); returns d = a·b + c (8 × 8 rows).
function M.dmma_check(a, b, c)
  local op = 'cuda.dmma_check'
  local fa, fb, fc = flat(op, 'double[?]', a, 8, 4, 'a'), flat(op, 'double[?]', b, 4, 8, 'b'),
    flat(op, 'double[?]', c, 8, 8, 'c')
  local d = ffi.new('double[64]')
  if C.pn_cuda_dmma_check(fa, fb, fc, d) ~= 0 then error(B.last_error(), 2) end
  return unflat(d, 8, 8)
end

return M
