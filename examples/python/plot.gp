# Test accuracy (mean, min and max over seeds) and what the graph holds after forward, per
# configuration, for the Python Fashion-MNIST runs.
# gnuplot -e "datafile='runs.dat'; outfile='plot.png'" plot.gp   (summary.py writes runs.dat:
# block 0 the CNN, block 1 the ViT; columns model, label, mean, min, max, saved MiB, position)
set terminal pngcairo size 1300,560 font ",10"
set output outfile
set multiplot layout 1,2
set grid ytics
set key top right
set xtics rotate by -20 noenhanced
set offsets 0.5, 0.5, 0, 0
set ylabel "test accuracy (%)"
set title "Fashion-MNIST test accuracy (mean; bars: min and max over seeds)"
plot datafile index 0 using ($7-0.1):3:4:5:xtic(2) with yerrorbars lw 2 pt 7 title "CNN", \
     datafile index 1 using ($7+0.1):3:4:5 with yerrorbars lw 2 pt 9 title "ViT"
set ylabel "held by the graph after forward (MiB)"
set title "Saved for backward (counting allocator)"
set yrange [0:*]
set style fill solid 0.6
set boxwidth 0.35
plot datafile index 0 using ($7-0.2):6:xtic(2) with boxes title "CNN", \
     datafile index 1 using ($7+0.2):6 with boxes title "ViT"
unset multiplot
