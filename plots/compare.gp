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
# one run: the bar and its value, no error bar and no "± 0"; more: mean ± std and the count
label(m, sd, c) = c > 1 ? sprintf("%.4f\n± %.4f (n=%d)", m, sd, c) : sprintf("%.4f\n1 run", m)
plot datafile using 1:3:($5 > 1 ? $4 : 0):xtic(2) with boxerrorbars lc rgb colour(1) lw 1.5, \
     datafile using 1:($3 + $4):(label($3, $4, $5)) with labels offset 0, 1.4 font ',9'
