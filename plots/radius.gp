# plots/radius.gp — histograms of learned radii / heights (/radii/<tag>), several overlaid
# (cf. Gulcehre et al., Hyperbolic Attention Networks, Fig. 3 right).
# Driven by `./bench plot radius` (lua/penumbra/plot.lua); the vars file sets:
#   set terminal …; set output …
#   datafile    blocks (two blank lines apart), one per series: "centre count lo hi" per bin
#   n, titles[n]; plot_title, xlab, ylab; logx (bins were made in log space)
load dir . 'common.gp'
set title plot_title
set xlabel xlab
set ylabel ylab
set yrange [0:*]
if (logx) { set logscale x }
set key below horizontal height 1
set offsets 0, 0, graph 0.05, 0
set style fill transparent solid 0.45 border
plot for [i=1:n] datafile index (i-1) using 1:2:3:4:(0):2 with boxxyerror lc rgb colour(i) title titles[i]
