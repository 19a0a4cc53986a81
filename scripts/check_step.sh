# Sourced by scripts/gpu_check.sh and scripts/cpu_check.sh (they set OUT, DEADLINE and T0).
# step NAME SECONDS LINES CMD...: run CMD under min(SECONDS, what is left of DEADLINE), its
# output in $OUT/logs/NAME.txt, its last LINES lines printed, the logs tarred after each step
# (a device run returns at most 8 files).
step() {
    local name=$1 secs=$2 lines=$3 left
    shift 3
    left=$(( DEADLINE - ($(date +%s) - T0) ))
    if [ "$left" -lt 20 ]; then echo "== $name: skipped (deadline)"; return; fi
    [ "$secs" -gt "$left" ] && secs=$left
    local t=$(date +%s)
    timeout -k 5 "$secs" "$@" > "$OUT/logs/$name.txt" 2>&1
    echo "== $name: exit $?, $(( $(date +%s) - t )) s"
    tail -n "$lines" "$OUT/logs/$name.txt"
    (cd "$OUT" && tar czf logs.tgz logs)
}
