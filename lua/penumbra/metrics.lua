-- penumbra.metrics — classification metrics on tensors, accumulated over batches.
--
--   local c = pn.metrics.f1_counts(logits, y [, c])   multi-label counts: logits (N, C) (a
--        label is predicted where logit > 0), y (N, C) 0/1; adds to c (or a new table):
--        c.tp, c.fp, c.fn (C) f64 tensors. A NaN logit makes its label's counts NaN (and so
--        the micro-F1): a diverged model never scores as one that predicts nothing. A y value
--        other than 0 or 1 (NaN included) is an error naming its row and label.
--   local micro, per_label = pn.metrics.f1(c)         micro-F1 = 2·Σtp / (2·Σtp + Σfp + Σfn),
--        and the per-label F1 list (NaN for a label with no positives and no predictions)
-- A micro-F1 with nothing true and nothing predicted is NaN, never a silent number.
--   pn.metrics.correct(logits, y)    single-label: how many rows of logits (N, C) have their
--        argmax at y (N) (class ids, 0-based, integer dtype); NaN when any logit is NaN (argmax
--        would pick the NaN's column, as PyTorch's does, and a diverged model would score)
--   pn.metrics.accuracy(logits, y)   correct / N (NaN for N = 0)
local pn = require 'penumbra.tensor'
local is_tensor = require('penumbra_ffi').is_tensor

local M = {}

-- the first y value that is not a 0/1 label, as an error (only called when there is one)
local function bad_label(y)
  local rows = y:totable()
  for i, row in ipairs(rows) do
    for l, v in ipairs(row) do
      if v ~= 0 and v ~= 1 then
        error(string.format('metrics.f1_counts: y must hold 0/1 labels, got %s at row %d, label %d', tostring(v), i, l), 3)
      end
    end
  end
end

local COUNTS = { 'tp', 'fp', 'fn' }

-- logits (N, C) and class ids y (N), checked for op (the public function that was called)
local function class_args(op, logits, y)
  if not is_tensor(logits) or not is_tensor(y) then
    error(string.format('%s: logits and y must be tensors, got %s and %s', op, type(logits), type(y)), 3)
  end
  local ls, ys = logits:shape(), y:shape()
  if #ls ~= 2 or #ys ~= 1 or ls[1] ~= ys[1] then
    error(string.format('%s: logits (%s) must be (N, C) and y (%s) (N)', op, table.concat(ls, ', '),
      table.concat(ys, ', ')), 3)
  end
  if y:dtype() ~= 'i64' and y:dtype() ~= 'i32' then
    error(op .. ': y must hold class ids (i64 or i32), got ' .. y:dtype(), 3)
  end
end

local function count_correct(logits, y)
  if logits:ne(logits):sum():item() > 0 then return 0 / 0 end
  return logits:argmax(-1):eq(y):to('f64'):sum():item()
end

function M.correct(logits, y)
  class_args('metrics.correct', logits, y)
  return count_correct(logits, y)
end

function M.accuracy(logits, y)
  class_args('metrics.accuracy', logits, y)
  return count_correct(logits, y) / y:shape()[1]
end

function M.f1_counts(logits, y, c)
  if not is_tensor(logits) or not is_tensor(y) then
    error(string.format('metrics.f1_counts: logits and y must be tensors, got %s and %s', type(logits), type(y)), 2)
  end
  local ls, ys = logits:shape(), y:shape()
  if #ls ~= 2 or #ys ~= 2 or ls[1] ~= ys[1] or ls[2] ~= ys[2] then
    error(string.format('metrics.f1_counts: logits (%s) and y (%s) must both be (N, C)', table.concat(ls, ', '),
      table.concat(ys, ', ')), 2)
  end
  if c ~= nil then
    for _, k in ipairs(COUNTS) do
      if type(c) ~= 'table' or not is_tensor(c[k]) then
        error('metrics.f1_counts: c must be the table an earlier f1_counts returned (tp, fp, fn tensors)', 2)
      end
    end
  end
  if (y:ne(0) * y:ne(1)):sum():item() > 0 then bad_label(y) end
  local pred = logits:gt(0):to('f64')
  local t = y:to('f64')
  -- sqrt(−count of NaN logits): 0 for a clean label, NaN for one with a NaN logit
  local poison = logits:ne(logits):to('f64'):sum(1):neg():sqrt()
  local tp = (pred * t):sum(1) + poison
  local fp = (pred * (1 - t)):sum(1) + poison
  local fn = ((1 - pred) * t):sum(1) + poison
  if not c then return { tp = tp, fp = fp, fn = fn } end
  c.tp, c.fp, c.fn = c.tp + tp, c.fp + fp, c.fn + fn
  return c
end

function M.f1(c)
  for _, k in ipairs(COUNTS) do
    if type(c) ~= 'table' or not is_tensor(c[k]) then
      error('metrics.f1: c must be the table f1_counts returned (tp, fp, fn tensors)', 2)
    end
  end
  local tp, fp, fn = c.tp:sum():item(), c.fp:sum():item(), c.fn:sum():item()
  local micro = (2 * tp + fp + fn) > 0 and 2 * tp / (2 * tp + fp + fn) or 0 / 0
  local per = {}
  local T, P, N = c.tp:totable(), c.fp:totable(), c.fn:totable()
  for l = 1, #T do
    local d = 2 * T[l] + P[l] + N[l]
    per[l] = d > 0 and 2 * T[l] / d or 0 / 0
  end
  return micro, per
end

return M
