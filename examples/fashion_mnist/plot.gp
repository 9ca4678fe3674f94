# Test accuracy and activation memory against gamma for the Fashion-MNIST runs.
# gnuplot -e "datafile='runs.dat'; outfile='plot.png'" plot.gp   (summary.py writes runs.dat:
# blocks cnn MinK, cnn Random, vit MinK, vit Random; gamma 0 is the baseline)
set terminal pngcairo size 1200,520 font ",11"
set output outfile
set multiplot layout 1,2
set grid
set key below horizontal
set xlabel "gamma (fraction of each saved input dropped)"
set xrange [-0.05:1.0]
set ylabel "test accuracy (%)"
set title "Fashion-MNIST test accuracy (mean over seeds)"
plot datafile index 0 using 1:2 with linespoints lw 2 pt 7 title "CNN, MinK", \
     datafile index 1 using 1:2 with points pt 5 ps 1.5 title "CNN, Random", \
     datafile index 2 using 1:2 with linespoints lw 2 pt 9 title "ViT, MinK", \
     datafile index 3 using 1:2 with points pt 11 ps 1.5 title "ViT, Random"
set ylabel "activation memory of a step (MiB)"
set title "Step peak minus memory held before forward (counting allocator)"
set yrange [0:*]
plot datafile index 0 using 1:3 with linespoints lw 2 pt 7 title "CNN, MinK", \
     datafile index 1 using 1:3 with points pt 5 ps 1.5 title "CNN, Random", \
     datafile index 2 using 1:3 with linespoints lw 2 pt 9 title "ViT, MinK", \
     datafile index 3 using 1:3 with points pt 11 ps 1.5 title "ViT, Random"
unset multiplot
