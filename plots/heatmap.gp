# plots/heatmap.gp — one head of an attention map /attention/<tag> (H, Nq, Nk): queries down,
# keys across, weight as colour (viridis) with a colour bar (cf. Coneheads Fig. 5).
# Driven by `./bench plot heatmap` (lua/penumbra/plot.lua); the vars file sets:
#   set terminal …; set output …
#   datafile    "key query weight" per cell, a blank line after each query row
#   labelfile   index 0: "key label" (x tics), index 1: "query label" (y tics); has_labels
#   nq, nk; plot_title, xlab, ylab, cblab; show_values (write the weight in each cell);
#   cbmid (values above it get dark text)
load dir . 'common.gp'
unset grid
set title plot_title
set xlabel xlab
set ylabel ylab
set cblabel cblab
set palette defined (0 '#440154', 0.125 '#472d7b', 0.25 '#3b528b', 0.375 '#2c728e', \
                     0.5 '#21918c', 0.625 '#28ae80', 0.75 '#5ec962', 0.875 '#addc30', 1 '#fde725')
set xrange [0.5:nk+0.5]
set yrange [nq+0.5:0.5]
set size ratio -1
set border 15 lc rgb '#444444'
set tics scale 0.5
if (has_labels) { set xtics rotate by 45 right }
if (has_labels) {
  if (show_values) {
    plot datafile using 1:2:3 with image, \
         labelfile index 0 using 1:(NaN):xtic(2), labelfile index 1 using (NaN):1:ytic(2), \
         datafile using 1:2:(sprintf('%.2f', $3)):($3 > cbmid ? 0 : 0xffffff) with labels tc rgb variable
  } else {
    plot datafile using 1:2:3 with image, \
         labelfile index 0 using 1:(NaN):xtic(2), labelfile index 1 using (NaN):1:ytic(2)
  }
} else {
  if (show_values) {
    plot datafile using 1:2:3 with image, \
         datafile using 1:2:(sprintf('%.2f', $3)):($3 > cbmid ? 0 : 0xffffff) with labels tc rgb variable
  } else {
    plot datafile using 1:2:3 with image
  }
}
