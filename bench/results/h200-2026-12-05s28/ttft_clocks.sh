#!/usr/bin/env bash
# Session 28, on an H200 (called by call2.sh and call3.sh with G=<gpu-bench> O=<log folder>):
# TTFT 2048 back to back against 300 ms idle before each run, alternated twice, with nvidia-smi
# sampling SM clock, power and the clock-event (throttle) reasons every 20 ms; offline
# 512x128/128 and decode batch 1 for the record; then the busy samples' clocks and reasons
# between each run's marks.
: "${G:?gpu-bench}" "${O:?log folder}"
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
R=clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown
nvidia-smi --query-gpu=$R --format=csv >/dev/null 2>&1 || R=$(echo $R | sed 's/clocks_event_reasons/clocks_throttle_reasons/g')
nvidia-smi --query-gpu=$Q,$R --format=csv -lms 20 >$O/smi.csv 2>$O/smi.err &
SMI=$!
sleep 1
for round in 1 2; do for gap in 0 300; do
  echo "$(date +%H:%M:%S.%N) ttft gap $gap round $round start" >>$O/marks.log
  timeout 100 $G ttft --model llama-2-7b --input-len 2048 --gap-ms $gap >>$O/gap_ttft.jsonl 2>>$O/gap.log
  echo "$(date +%H:%M:%S.%N) ttft gap $gap round $round end rc $?" >>$O/marks.log
done; done
echo "$(date +%H:%M:%S.%N) offline start" >>$O/marks.log
timeout 120 $G offline --model llama-2-7b --num-prompts 512 --input-len 128 --output-len 128 >$O/offline.jsonl 2>$O/offline.log
echo "$(date +%H:%M:%S.%N) offline end rc $?" >>$O/marks.log
kill $SMI
grep -v "INFO\|BackendInfo" $O/gap.log | tail -8
tail -1 $O/offline.log
timeout 60 $G decode --quick --model llama-2-7b --output-len 512 >>$O/decode.jsonl 2>>$O/decode.log
tail -1 $O/decode.log
python3 - "$O" <<'PY'
# Busy samples (utilization > 50 %) of the smi log between each run's marks: SM clock and
# the clock-event reasons seen.
import csv, sys, collections, datetime
o = sys.argv[1]
rows = list(csv.reader(open(f"{o}/smi.csv")))
head = [h.strip() for h in rows[0]]
def t(s):
    return datetime.datetime.strptime(s.strip()[:23], "%Y/%m/%d %H:%M:%S.%f").time()
marks = [l.split() for l in open(f"{o}/marks.log")]
spans = []
for a, b in zip(marks[::2], marks[1::2]):
    spans.append((" ".join(a[1:-1]), datetime.datetime.strptime(a[0][:15], "%H:%M:%S.%f").time(),
                  datetime.datetime.strptime(b[0][:15], "%H:%M:%S.%f").time()))
for name, s, e in spans:
    busy = [r for r in rows[1:] if len(r) == len(head) and s <= t(r[0]) <= e
            and float(r[head.index("utilization.gpu [%]")].split()[0]) > 50]
    clocks = collections.Counter(r[1].strip() for r in busy)
    reasons = collections.Counter(tuple(x.strip() for x in r[6:]) for r in busy)
    print(name, len(busy), "busy samples; SM clocks", dict(clocks.most_common(6)))
    print("   reasons", dict(reasons.most_common(4)))
PY
