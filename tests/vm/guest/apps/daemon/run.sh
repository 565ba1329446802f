# A daemon left behind by a successful command: it must not outlive its request.
setsid sh -c 'trap "" TERM HUP; exec sleep 1000' < /dev/null > /dev/null 2>&1 &
# Alive for two seconds before the command ends: long enough to be seen from outside.
sleep 2
echo "apiVersion: v1"
echo "kind: ConfigMap"
echo "metadata: {name: daemonized}"
