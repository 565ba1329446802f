# A CPU burner: two busy loops for 4 s against cpuMillis: 500; cpu.max must throttle them.
timeout 4 sh -c 'while :; do :; done' &
timeout 4 sh -c 'while :; do :; done'
wait
echo "apiVersion: v1"
echo "kind: ConfigMap"
echo "metadata: {name: burned}"
