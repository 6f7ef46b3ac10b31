-- penumbra.text — text for NMT: sentencepiece BPE (text/bpe.lua over core/text/spm.cc) and
-- corpus BLEU / chrF equal to sacreBLEU's (text/bleu.lua over core/text/bleu.c).
--
--   pn.text.bpe{train = {files…}, vocab = 8000, …}   a tokenizer (trained once, cached)
--   pn.text.bleu(hyp_lines, ref_lines)               {score, precisions, bp, ratio, sys_len, ref_len, line}
--   pn.text.chrf(hyp_lines, ref_lines)               {score, …}
-- The modules load on first use (require 'penumbra' stays cheap for graph work).
local text = {}
function text.bpe(...) return require('penumbra.text.bpe').bpe(...) end
function text.bleu(...) return require('penumbra.text.bleu').bleu(...) end
function text.chrf(...) return require('penumbra.text.bleu').chrf(...) end
return text
