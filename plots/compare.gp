# plots/compare.gp — the `./bench compare` table as bars: mean ± std of one metric per
# experiment, with the numbers written above the bars.
# Driven by `./bench plot compare` (lua/penumbra/plot.lua); the vars file sets:
#   set terminal …; set output …
#   datafile    one line per experiment: 'index "name" mean std count'
#   n; plot_title, ylab; ymin (bottom of the y axis; bars start there); rotate (long names)
load dir . 'common.gp'
set title plot_title
set ylabel ylab
set xrange [0.4:n+0.6]
set yrange [ymin:*]
set grid noxtics ytics
set style fill solid 0.65 border lc rgb '#333333'
set boxwidth 0.6
set xtics scale 0
if (rotate) { set xtics rotate by 30 right }
set offsets 0, 0, graph 0.12, 0
plot datafile using 1:3:4:xtic(2) with boxerrorbars lc rgb colour(1) lw 1.5, \
     datafile using 1:($3 + $4):(sprintf("%.4f\n± %.4f", $3, $4)) with labels offset 0, 1.4 font ',9'
