# A daemon left behind by a successful command: it must not outlive its request.
setsid sh -c 'trap "" TERM HUP; exec sleep 1000' < /dev/null > /dev/null 2>&1 &
echo "apiVersion: v1"
echo "kind: ConfigMap"
echo "metadata: {name: daemonized}"
