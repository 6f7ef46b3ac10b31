# plots/curves.gp — logged metrics over epochs/steps: one line per (run, metric); the colour
# tells the run, the dash pattern the metric.
# Driven by `./bench plot curves` (lua/penumbra/plot.lua), which loads a vars file first with:
#   set terminal …; set output …; dir (this folder, for common.gp)
#   datafile    blocks separated by two blank lines, one per series: "step value smoothed"
#   n, titles[n] series count and legend texts; run_of[n], metric_of[n] (1-based indices)
#   smooth      1: raw values faint, moving average bold; 0: raw values only
#   points      1: few points, mark them
#   plot_title, xlab, ylab, logy
#   key_mode    1: legend below (few series); 2: beside the axes, one column (many); 0: none
load dir . 'common.gp'
set title plot_title
set xlabel xlab
set ylabel ylab
if (logy) { set logscale y }
if (key_mode == 1) { set key below horizontal height 1 }
if (key_mode == 2) { set key outside right top vertical Left reverse font ',8' spacing 0.9 samplen 2 }
if (key_mode == 0) { unset key }
pt_style = points ? 'linespoints pt 7 ps 0.6' : 'lines'
if (smooth) {
  plot for [i=1:n] datafile index (i-1) using 1:2 with lines lw 1 dt metric_of[i] lc rgb faint(run_of[i]), \
       for [i=1:n] datafile index (i-1) using 1:3 with @pt_style lw 2 dt metric_of[i] lc rgb colour(run_of[i]) title titles[i]
} else {
  plot for [i=1:n] datafile index (i-1) using 1:2 with @pt_style lw 2 dt metric_of[i] lc rgb colour(run_of[i]) title titles[i]
}
