# The kernel matrix's scenarios, sourced by init: the server in three cgroup placements (the
# root cgroup of a VM, a systemd-style service cgroup with another process in it, a container's
# own cgroup namespace), a restart, doctor and render before and beside it. Nothing is judged
# here: tests/vm/judge.py reads what is recorded in $OUT (audit events, client answers, the
# request cgroups' own files sampled while they run, what is left afterwards).
POLICY=/etc/cmp-warden/policy.yaml
CG=/sys/fs/cgroup
export ARGOCD_PLUGINSOCKFILEPATH=/plugins ARGOCD_CMP_WORKDIR=/work

uname -r > $OUT/kernel.release
uname -m > $OUT/kernel.machine
cat $CG/cgroup.controllers > $OUT/cgroup.controllers

# Every request cgroup's limits and counters, every 0.2 s while anything runs:
# name|memory.max|memory.swap.max|memory.oom.group|pids.max|pids.current|pids.events max|
# cpu.max|cpu.stat nr_throttled|memory.events oom_kill
sample() {
  while :; do
    for d in $(find $CG -type d -name 'j*' 2>/dev/null); do
      echo "${d##*/}|$(cat $d/memory.max)|$(cat $d/memory.swap.max)|$(cat $d/memory.oom.group)|$(cat $d/pids.max)|$(cat $d/pids.current)|$(sed -n 's/^max //p' $d/pids.events)|$(cat $d/cpu.max)|$(sed -n 's/^nr_throttled //p' $d/cpu.stat)|$(sed -n 's/^oom_kill //p' $d/memory.events)"
    done 2>/dev/null
    sleep 0.2
  done
}
sample >> $OUT/samples &
SAMPLER=$!

# A listener outside every jail, for the probes' reachHost, reached from here (the control: a
# refusal inside is the jail's, not a listener missing).
nc -ll -p 8080 -e echo host-listener > /dev/null 2>&1 &
sleep 1
if (sleep 1 | nc 127.0.0.1 8080) 2>&1 | grep -q host-listener; then echo reached; else echo unreached; fi > $OUT/listener-control

# enable DIR: memory, pids and cpu for DIR's children (as systemd or a runtime delegates).
enable() {
  for c in memory pids cpu; do echo "+$c" > "$1/cgroup.subtree_control"; done
}

# serve PLACE PROCS [WRAPPER...]: the server started as a process of the cgroup whose
# cgroup.procs is PROCS (through WRAPPER), waited for until its socket is there. A new socket
# directory each time, unless KEEP_SOCKET_DIR is set (a container restarted in its pod keeps
# its emptyDir: the UID leases, by which a restart knows the dead server's jails for its own).
serve() {
  place=$1 procs=$2
  shift 2
  mkdir -p $OUT/$place
  if [ -n "${KEEP_SOCKET_DIR:-}" ]; then rm -f /plugins/vm.sock; else rm -rf /plugins && mkdir -p /plugins; fi
  sh -c 'echo $$ > "$0" && exec "$@"' "$procs" "$@" \
    cmp-warden --config-dir-path /config --policy $POLICY \
    --audit-log $OUT/$place/audit.jsonl > $OUT/$place/server.log 2>&1 &
  SERVER=$!
  i=0
  while [ ! -S /plugins/vm.sock ] && [ $i -lt 900 ] && kill -0 $SERVER 2>/dev/null; do
    sleep 0.2
    i=$((i + 1))
  done
  if [ -S /plugins/vm.sock ]; then echo up; else echo down; fi > $OUT/$place/started
}

stop() {
  kill -TERM $SERVER 2>/dev/null
  wait $SERVER
  echo $? > $OUT/$1/exit
}

# req PLACE NAME APP [client flags]: one GenerateManifest, its answer and exit status kept.
req() {
  place=$1 name=$2 app=$3
  shift 3
  cmp-warden client generate /apps/$app --socket /plugins/vm.sock "$@" > $OUT/$place/$name.out 2>&1
  echo $? > $OUT/$place/$name.rc
}

# leftovers PLACE WHEN: request cgroups, instance cgroups (cmp-warden-FIRST) and processes of
# the sandbox UIDs (20000+1000) now.
leftovers() {
  sleep 1
  find $CG -type d -name 'j*' > $OUT/$1/cgroups-$2
  find $CG -type d -name 'cmp-warden-[0-9]*' > $OUT/$1/instances-$2
  for p in /proc/[0-9]*; do
    uid=$(sed -n 's/^Uid:\t\([0-9]*\).*/\1/p' $p/status 2>/dev/null)
    [ -n "$uid" ] && [ "$uid" -ge 20000 ] && [ "$uid" -lt 21000 ] &&
      echo "$uid $(tr '\0' ' ' < $p/cmdline)"
  done > $OUT/$1/processes-$2
}

# oomkills PLACE WHEN: the kernel's oom_kill count of the instance cgroups, summed (v2's
# memory.events is hierarchical: it counts the kills in their request cgroups, and keeps them
# once those are removed).
oomkills() {
  n=0
  for d in $(find $CG -type d -name 'cmp-warden-[0-9]*'); do
    k=$(sed -n 's/^oom_kill //p' $d/memory.events 2>/dev/null)
    n=$((n + ${k:-0}))
  done
  echo $n > $OUT/$1/oomkills-$2
}

# memhog PLACE: the memory hog's request, between two counts of the kernel's OOM kills.
memhog() {
  oomkills $1 before-memhog
  req $1 memhog memhog
  oomkills $1 after-memhog
}

# settled PLACE APP: until APP's request has its audit event (the server has reclaimed it: a
# client that gave up at its deadline returns before that), at most 60 s.
settled() {
  i=0
  while ! grep -q "\"app\":\"$2\"" $OUT/$1/audit.jsonl 2>/dev/null && [ $i -lt 300 ]; do
    sleep 0.2
    i=$((i + 1))
  done
}

# 1. doctor and render before any server: their one-shot state must not break the server.
cmp-warden doctor --policy $POLICY --json > $OUT/doctor.json 2> $OUT/doctor.err
echo $? > $OUT/doctor.rc
cmp-warden render /apps/honest --config-dir-path /config --policy $POLICY > $OUT/render.out 2>&1
echo $? > $OUT/render.rc
find $CG -type d > $OUT/cgroups-after-oneshot
# What a new cgroup has here (controllers on at the root since doctor): the kernel's features.
mkdir $CG/features && ls $CG/features > $OUT/cgroup-files && rmdir $CG/features

# 2. The server in the VM's root cgroup: every attack, then doctor beside it.
serve root $CG/cgroup.procs
req root honest honest
req root honest-again honest
memhog root
req root forkbomb forkbomb
req root cpuburn cpuburn
req root overrun overrun --timeout 8
settled root overrun
leftovers root after-overrun
req root daemon daemon
settled root daemon
leftovers root after-daemon
req root probe probe
cmp-warden doctor --policy $POLICY --json > $OUT/root/doctor-beside.json 2> $OUT/root/doctor-beside.err
echo $? > $OUT/root/doctor-beside.rc
stop root
leftovers root stopped

# 3. A restart: the instance directory and controllers the first run left are reused.
serve restart $CG/cgroup.procs
req restart honest honest
memhog restart
stop restart
leftovers restart stopped

# 3b. A crash: the server SIGKILLed while a request runs (its daemon and its jail outlive it
#     for a moment); the restart, with the same policy, directories and UIDs, removes all the
#     dead one left, serves, and stops clean.
serve crash $CG/cgroup.procs
cmp-warden client generate /apps/overrun --socket /plugins/vm.sock --timeout 300 \
  > $OUT/crash/in-flight.out 2>&1 &
CLIENT=$!
overrun_running() {
  for p in /proc/[0-9]*; do
    case "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" in "sleep 1000"*) return 0 ;; esac
  done
  return 1
}
i=0
until overrun_running || [ $i -ge 600 ]; do
  sleep 0.2
  i=$((i + 1))
done
leftovers crash before-kill
kill -KILL $SERVER
wait $SERVER
echo $? > $OUT/crash/exit
wait $CLIENT
echo $? > $OUT/crash/in-flight.rc
find $CG -type d -name 'j*' > $OUT/crash/cgroups-killed
KEEP_SOCKET_DIR=1 serve crash-restart $CG/cgroup.procs
leftovers crash-restart restarted
req crash-restart honest honest
stop crash-restart
leftovers crash-restart stopped

# 4. A systemd-style service cgroup (two levels below the root) that holds another process
#    too: the server moves both into its leaf before it delegates controllers.
enable $CG
mkdir -p $CG/system.slice/cmp-warden.service
enable $CG/system.slice
sh -c 'echo $$ > "$0" && exec sleep 600' $CG/system.slice/cmp-warden.service/cgroup.procs &
SIBLING=$!
serve service $CG/system.slice/cmp-warden.service/cgroup.procs
cat $CG/system.slice/cmp-warden.service/cgroup.procs > $OUT/service/procs-in-delegated
req service honest honest
memhog service
req service forkbomb forkbomb
stop service
leftovers service stopped
kill $SIBLING

# 5. A container's own cgroup namespace and cgroupfs: the server sees its cgroup as the root.
mkdir -p $CG/kubepods/pod1/ctr
enable $CG/kubepods
enable $CG/kubepods/pod1
serve container $CG/kubepods/pod1/ctr/cgroup.procs cgns
req container honest honest
memhog container
stop container
leftovers container stopped

# 6. A container whose cgroupfs is read-only (Kubernetes without containerd's cgroup_writable):
#    no request cgroup can be made. Its memory limit catches the hog; the OOM killer takes the
#    command (oom_score_adj 1000), never the server, and the next request is served.
sed 's/, seccomp, cgroups]/, seccomp]/' $POLICY > /etc/cmp-warden/policy-no-cgroups.yaml
mkdir -p $CG/kubepods/pod2/ctr
enable $CG/kubepods/pod2
echo 200000000 > $CG/kubepods/pod2/ctr/memory.max
echo 0 > $CG/kubepods/pod2/ctr/memory.swap.max
POLICY=/etc/cmp-warden/policy-no-cgroups.yaml
CGNS_READONLY=1 serve readonly $CG/kubepods/pod2/ctr/cgroup.procs cgns
req readonly honest honest
req readonly memhog memhog
req readonly honest-after honest
stop readonly
leftovers readonly stopped

# 7. AppArmor (Debian's kernels enable it): under containerd's default profile as documented
#    (deny mount) and under deploy/apparmor's profile for the sidecar, doctor; then the server
#    under deploy/'s profile, attacked. A profile applies from the next exec (attr/exec).
POLICY=/etc/cmp-warden/policy.yaml
mkdir -p $OUT/apparmor
mount -t securityfs securityfs /sys/kernel/security
cat > /tmp/aa-exec <<'AA'
#!/bin/sh
profile=$1
shift
echo -n "exec $profile" > /proc/self/attr/exec && exec "$@"
AA
chmod 755 /tmp/aa-exec
if /sbin/apparmor_parser -r /etc/apparmor/runtime-default /etc/apparmor/cmp-warden \
    > $OUT/apparmor/load.log 2>&1; then
  for p in cmpw-runtime-default cmp-warden; do
    /tmp/aa-exec $p cmp-warden doctor --policy $POLICY --json \
      > $OUT/apparmor/doctor-$p.json 2> $OUT/apparmor/doctor-$p.err
  done
  serve apparmor $CG/cgroup.procs /tmp/aa-exec cmp-warden
  cat /proc/$SERVER/attr/current > $OUT/apparmor/server-profile 2>&1
  req apparmor honest honest
  req apparmor honest-again honest
  req apparmor probe probe
  stop apparmor
fi

# 8. network.loopback (the Pulumi example's shape): under a policy with `loopback: true` a
#    command listens and connects on its jail's own loopback, and the VM's own listener on
#    127.0.0.1:7070 stays out of reach; under the default policy (network: none) the same
#    command's listen is refused.
POLICY=/etc/cmp-warden/policy.yaml
mkdir -p $OUT/loopback
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
nc -ll -p 7070 -e echo vm-listener > /dev/null 2>&1 &
VMLISTENER=$!
sleep 1
(sleep 1 | nc 127.0.0.1 7070) > $OUT/loopback/vm-self 2>&1
serve loopnone $CG/cgroup.procs
req loopnone loopback loopback
stop loopnone
sed 's/network: {mode: none}/network: {mode: none, loopback: true}/' $POLICY > /etc/cmp-warden/policy-loopback.yaml
POLICY=/etc/cmp-warden/policy-loopback.yaml
serve loopback $CG/cgroup.procs
req loopback loopback loopback
stop loopback
POLICY=/etc/cmp-warden/policy.yaml
kill $VMLISTENER

# 9. The shared-UID model (an unprivileged server in a cgroup delegated to it: every command
#    runs as the server's UID) without a PID namespace: there is no UID to kill by and no
#    namespace init to take a daemon along, so v2's cgroup.kill alone ends the daemon its
#    request left behind. The daemon's processes of that UID are listed while the request
#    runs (it was there) and once its audit event is written (it is gone).
mkdir -p $OUT/shareduid /shared/plugins /shared/work $CG/user.slice/cmp-warden
enable $CG
enable $CG/user.slice
chown -R 1000:1000 /shared $CG/user.slice/cmp-warden $OUT/shareduid
sed -e 's/require: \[uniqueUid, /require: [/' -e 's/^  namespaces: .*/  namespaces: []/' $POLICY \
  > /etc/cmp-warden/policy-shared-uid.yaml
# (One grep over every status file: a process per PID would take seconds under TCG.)
daemons_of_1000() {
  for s in $(grep -l '^Uid:[[:space:]]1000[[:space:]]' /proc/[0-9]*/status 2>/dev/null); do
    p=${s%/status}
    c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null)
    case $c in "sleep 1000"*) echo "${p#/proc/} $c" ;; esac
  done
}
# busybox's setpriv cannot change UIDs; its su can, for a user /etc/passwd names.
echo "warden:x:1000:1000::/shared:/bin/sh" >> /etc/passwd
echo "warden:x:1000:" >> /etc/group
sh -c 'echo $$ > "$0" && exec "$@"' $CG/user.slice/cmp-warden/cgroup.procs \
  su -s /bin/sh warden -c "exec env ARGOCD_PLUGINSOCKFILEPATH=/shared/plugins \
    ARGOCD_CMP_WORKDIR=/shared/work cmp-warden --config-dir-path /config \
    --policy /etc/cmp-warden/policy-shared-uid.yaml --allowed-uids any \
    --audit-log $OUT/shareduid/audit.jsonl" > $OUT/shareduid/server.log 2>&1 &
SERVER=$!
i=0
while [ ! -S /shared/plugins/vm.sock ] && [ $i -lt 900 ] && kill -0 $SERVER 2>/dev/null; do
  sleep 0.2
  i=$((i + 1))
done
if [ -S /shared/plugins/vm.sock ]; then echo up; else echo down; fi > $OUT/shareduid/started
cmp-warden client generate /apps/daemon --socket /shared/plugins/vm.sock \
  > $OUT/shareduid/daemon.out 2>&1 &
CLIENT=$!
: > $OUT/shareduid/daemons-during
while kill -0 $CLIENT 2>/dev/null; do
  daemons_of_1000 >> $OUT/shareduid/daemons-during
  sleep 0.1
done
wait $CLIENT
echo $? > $OUT/shareduid/daemon.rc
settled shareduid daemon
sleep 1
daemons_of_1000 > $OUT/shareduid/daemons-after
stop shareduid

kill $SAMPLER
find $CG -type d > $OUT/cgroups-final
