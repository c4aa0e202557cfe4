#!/bin/bash
# Regenerates docs/BENCHMARKS.md's figures: builds in release mode, runs
# pipeline-bench (the pipeline against the C relay, same run) and writes
# docs/pipeline.csv, docs/pipeline-bench.txt and the plot
# docs/pipeline-latency.svg (gnuplot). Needs the local broker
# (bash scripts/broker.sh start).
#
#   bash scripts/bench-plot.sh [--requests N]
set -euo pipefail
cd "$(dirname "$0")/.."
requests=4000
if [ "${1:-}" = --requests ]; then requests="$2"; fi
command -v gnuplot >/dev/null || { echo "bench-plot: install gnuplot-nox" >&2; exit 2; }
swift build -c release >/dev/null
mkdir -p docs
.build/release/pipeline-bench --requests "$requests" --fractions 0.125,0.25,0.5,0.75 --csv docs/pipeline.csv 2>/dev/null \
    | tee docs/pipeline-bench.txt
gnuplot <<'PLOT'
set terminal svg size 760,500 dynamic font "sans,12"
set output "docs/pipeline-latency.svg"
set datafile separator ","
set title "request → replied latency against offered rate (2 cores, broker on the same machine)"
set xlabel "offered dispatches/s (the rightmost point of each line: as fast as confirms allow)"
set ylabel "latency, ms"
set logscale y
set key below maxrows 3 width -2
set grid
set arrow from graph 0, first 20 to graph 1, first 20 nohead dt 4 lc rgb "#cc0000"
set label "p99 target, 20 ms" at graph 0.01, first 23 tc rgb "#cc0000"
set y2label "machine busy, % of both cores"
set y2range [0:100]
set y2tics 20
plot "< grep '^pipeline' docs/pipeline.csv | sort -t, -k2 -n" using 2:6 with linespoints lw 2 title "pipeline p50", \
     "< grep '^pipeline' docs/pipeline.csv | sort -t, -k2 -n" using 2:7 with linespoints lw 2 title "pipeline p99", \
     "< grep '^c-relay' docs/pipeline.csv | sort -t, -k2 -n" using 2:6 with linespoints dt 2 title "C relay p50", \
     "< grep '^c-relay' docs/pipeline.csv | sort -t, -k2 -n" using 2:7 with linespoints dt 2 title "C relay p99", \
     "< grep '^pipeline' docs/pipeline.csv | sort -t, -k2 -n" using 2:($9*100) axes x1y2 with lines dt 3 lw 2 title "pipeline: machine busy", \
     "< grep '^c-relay' docs/pipeline.csv | sort -t, -k2 -n" using 2:($9*100) axes x1y2 with lines dt 3 title "C relay: machine busy"
PLOT
echo "bench-plot: wrote docs/pipeline.csv, docs/pipeline-bench.txt, docs/pipeline-latency.svg"
