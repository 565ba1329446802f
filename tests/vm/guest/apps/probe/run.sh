# Confinement probes: each attempt prints `name: denied (its error)` or `name: ALLOWED`. A probe
# whose program is missing fails the command: a refusal is only ever the kernel's.
try() {
  name=$1
  shift
  if ! command -v "$1" > /dev/null; then
    echo "probe $name: no $1 here" >&2
    exit 1
  fi
  if err=$("$@" 2>&1 > /dev/null); then
    echo "  $name: ALLOWED"
  else
    echo "  $name: denied ($(echo "$err" | head -n 1 | tr -d ':\"'))"
  fi
}
echo "apiVersion: v1"
echo "kind: ConfigMap"
echo "metadata: {name: probes}"
echo "data:"
try readSecret cat /secret/token
try writeWorkRoot touch /work/escape
try writeRoot touch /escape
try userNamespace unshare -U true
try mountTmpfs mount -t tmpfs none /tmp
try chrootRoot chroot / true
# The guest's own listener (matrix.sh), which the guest reaches from outside the jail.
try reachHost nc 127.0.0.1 8080
