# A fork bomb: 100 sleepers against pids: 32; the request's pids.max must refuse the rest.
# The bomb runs in a subshell (a shell gives up at its first refused fork); the survivors are
# then held for a while by a loop of builtins (no fork), so the cgroup is read at its limit.
(
  i=0
  while [ $i -lt 100 ]; do
    sleep 30 &
    i=$((i + 1))
  done
)
i=0
while [ $i -lt 40000 ]; do i=$((i + 1)); done
exit 1
