-- penumbra.metrics — classification metrics on tensors, accumulated over batches.
--
--   local c = pn.metrics.f1_counts(logits, y [, c])   multi-label counts: logits (N, C) (a
--        label is predicted where logit > 0), y (N, C) 0/1; adds to c (or a new table):
--        c.tp, c.fp, c.fn (C) f64 tensors
--   local micro, per_label = pn.metrics.f1(c)         micro-F1 = 2·Σtp / (2·Σtp + Σfp + Σfn),
--        and the per-label F1 list (NaN for a label with no positives and no predictions)
-- A micro-F1 with nothing true and nothing predicted is NaN, never a silent number.
local pn = require 'penumbra.tensor'

local M = {}

function M.f1_counts(logits, y, c)
  local ls, ys = logits:shape(), y:shape()
  if #ls ~= 2 or #ys ~= 2 or ls[1] ~= ys[1] or ls[2] ~= ys[2] then
    error(string.format('metrics.f1_counts: logits (%s) and y (%s) must both be (N, C)', table.concat(ls, ', '),
      table.concat(ys, ', ')), 2)
  end
  local pred = logits:gt(0):to('f64')
  local t = y:ne(0):to('f64')
  local tp = (pred * t):sum(1)
  local fp = (pred * (1 - t)):sum(1)
  local fn = ((1 - pred) * t):sum(1)
  if not c then return { tp = tp, fp = fp, fn = fn } end
  c.tp, c.fp, c.fn = c.tp + tp, c.fp + fp, c.fn + fn
  return c
end

function M.f1(c)
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
