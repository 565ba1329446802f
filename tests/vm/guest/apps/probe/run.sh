# Confinement probes: each attempt prints `name: denied (its error)` or `name: ALLOWED`.
try() {
  name=$1
  shift
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
try reachHost wget -q -T 2 -O /dev/null http://10.0.2.2:1/
