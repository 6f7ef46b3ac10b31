# plots/common.gp — shared look for the penumbra plots (loaded by the other scripts).
# A colour cycle that stays readable on white and in grey print, light grid, key below.
array colours[8] = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf']
colour(i) = colours[(i - 1) % 8 + 1]
# the same colour, mostly transparent ('#AARRGGBB', AA = transparency)
faint(i) = '#A0' . colour(i)[2:]
set border 3 lc rgb '#444444'
set tics nomirror out
set grid back lc rgb '#e5e5e5' lw 1
set key noautotitle
