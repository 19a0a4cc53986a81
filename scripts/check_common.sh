# Sourced by scripts/gpu_check.sh and scripts/cpu_check.sh (they set OUT, DEADLINE and T0).

# install_bundle DIR: the bundle's wheels into /tmp/site, this tree's Python over the wheel's
# (its compiled _C stays), DIR/shared as CCT_SHARED.
install_bundle() {
    BUNDLE=$(cd "$1" && pwd)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        "$BUNDLE"/whl/*.whl > "$OUT/logs/install.txt" 2>&1 || { cat "$OUT/logs/install.txt"; exit 1; }
    cp -r cct/. /tmp/site/cct/
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH CCT_SHARED=$BUNDLE/shared
}

# step NAME SECONDS LINES CMD...: run CMD under min(SECONDS, what is left of DEADLINE), its
# output in $OUT/logs/NAME.txt, its last LINES lines printed, the logs tarred after each step
# (a device run returns at most 8 files). With STEPS set (comma-separated names), only those
# steps run: a second device run can take the steps the first one's deadline left out.
step() {
    local name=$1 secs=$2 lines=$3 left
    shift 3
    case ",${STEPS:-$name}," in
        *",$name,"*) ;;
        *) return ;;     # not in STEPS
    esac
    left=$(( DEADLINE - ($(date +%s) - T0) ))
    if [ "$left" -lt 20 ]; then echo "== $name: skipped (deadline)"; return; fi
    [ "$secs" -gt "$left" ] && secs=$left
    local t=$(date +%s)
    timeout -k 5 "$secs" "$@" > "$OUT/logs/$name.txt" 2>&1
    echo "== $name: exit $?, $(( $(date +%s) - t )) s"
    tail -n "$lines" "$OUT/logs/$name.txt"
    (cd "$OUT" && tar czf logs.tgz logs)
}
