# What the shell system tests share with lib.py: the verdict lines, `PASS <case>` or
# `FAIL <case>: why`, and `N passed, M failed` when the test ends, however it ends (the count
# is taken from the test's own output, so the PASS lines its embedded Python prints count too).
#   . "$(dirname "$0")/lib.sh"; verdicts; on_exit 'cleanup'; … pass "what held"; … fail "why"

on_exit_cmds=()
# Run CMD when the test exits (before the count is printed); in the order registered.
on_exit() { on_exit_cmds+=("$1"); }

# From here on, count the PASS/FAIL lines of everything the test prints on stdout.
verdicts() {
  exec 3>&1 > >(awk '{ print; fflush() } /^PASS /{ p++ } /^FAIL /{ f++ }
                    END { printf "%d passed, %d failed\n", p, f }' >&3)
  verdicts_filter=$!
  trap 'verdicts_end' EXIT
}

verdicts_end() {
  local status=$? cmd
  if [ "$status" -ne 0 ] && [ -z "${verdicts_failed:-}" ]; then
    echo "FAIL the test stopped at a step that is not a case of its own (exit $status): the lines above say why"
  fi
  for cmd in "${on_exit_cmds[@]}"; do eval "$cmd" || true; done
  # The count comes when the filter sees the end of its input: close ours, give it a moment
  # (a process started in the background may still hold a copy; it is not waited for).
  exec 1>&3
  for _ in $(seq 50); do kill -0 "$verdicts_filter" 2>/dev/null || break; sleep 0.1; done
  exit "$status"
}

pass() { echo "PASS $*"; }

# A failed case ends the test: nothing after it can be trusted.
fail() { verdicts_failed=1; echo "FAIL $*"; exit 1; }
