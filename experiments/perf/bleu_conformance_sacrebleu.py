"""The sacreBLEU side of experiments/perf/bleu_conformance.lua (not run by CI).

usage: python bleu_conformance_sacrebleu.py MANIFEST OUTDIR

MANIFEST: one pair a line, "name<TAB>hyp file<TAB>ref file[<TAB>ref file …]".
Files are read as `sacrebleu REF -i HYP` reads them (UTF-8, lines split on '\\n' only, each
line right-stripped). For each pair one tab-separated line goes to stdout:
    name, repr(BLEU score), repr(chrF score), str(BLEU score), str(chrF score),
    counts (4, comma-separated), totals (4), sys_len, ref_len
and every distinct file's 13a tokenisation (sacreBLEU's Tokenizer13a of each line) is
written to OUTDIR/tok<k>.txt, k = the file's 1-based position in order of first appearance,
so the Lua side can compare tokenisations line by line.
"""
import logging
import os
import sys

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


def read(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def main():
    # the 'lines that end in a tokenized period' advice: our tokenised systems are meant to be
    logging.getLogger("sacrebleu").setLevel(logging.ERROR)
    manifest, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    tok = Tokenizer13a()
    files = {}
    cache = {}

    def lines_of(path):
        if path not in cache:
            cache[path] = read(path)
            files[path] = len(files) + 1
            with open(os.path.join(outdir, f"tok{files[path]}.txt"), "w", encoding="utf-8", newline="\n") as f:
                for line in cache[path]:
                    f.write(tok(line.rstrip()) + "\n")
        return cache[path]

    print(f"# sacrebleu {sacrebleu.__version__}, python {sys.version.split()[0]}", flush=True)
    with open(manifest, encoding="utf-8") as m:
        for row in m:
            row = row.rstrip("\n")
            if not row:
                continue
            name, hyp, *refs = row.split("\t")
            h = lines_of(hyp)
            rs = [lines_of(r) for r in refs]
            b = BLEU().corpus_score(h, rs)
            c = CHRF().corpus_score(h, rs)
            print("\t".join([name, repr(b.score), repr(c.score), str(b), str(c),
                             ",".join(str(x) for x in b.counts), ",".join(str(x) for x in b.totals),
                             str(b.sys_len), str(b.ref_len)]), flush=True)


if __name__ == "__main__":
    main()
