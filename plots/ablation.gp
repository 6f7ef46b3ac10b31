# plots/ablation.gp — a sweep table as lines: mean ± std of one metric against a swept setting
# (the q/k width), one line per series (the attention), error bars over seeds.
# Driven by `./bench plot ablation` (lua/penumbra/plot.lua); the vars file sets:
#   set terminal …; set output …
#   datafile    one block per series (split by two blank lines): 'x mean std count' per row
#   n, titles[n]; xs[] (the x values, one tick each); logx (1: log2 axis); xmin, xmax
#   points (the most runs behind a point: 1 draws no error bars); plot_title, xlab, ylab
load dir . 'common.gp'
set title plot_title
set xlabel xlab
set ylabel ylab
set key below horizontal height 1
if (logx) { set logscale x 2 }
set xrange [xmin:xmax]
set xtics ()
do for [i=1:|xs|] { set xtics add (sprintf('%g', xs[i]) xs[i]) }
set grid xtics ytics
set offsets 0, 0, graph 0.08, graph 0.08
if (points > 1) {
  plot for [i=1:n] datafile index (i - 1) using 1:2:3 with yerrorlines lc rgb colour(i) lw 2 pt 7 ps 1.1 title titles[i]
} else {
  plot for [i=1:n] datafile index (i - 1) using 1:2 with linespoints lc rgb colour(i) lw 2 pt 7 ps 1.1 title titles[i]
}
