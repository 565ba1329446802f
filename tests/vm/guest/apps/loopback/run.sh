# network.loopback: listen on the jail's own 127.0.0.1:7071 and connect to it, then connect to
# 127.0.0.1:7070, where the VM itself (outside every jail) listens. Prints what each saw; the
# words of an error are kept, its punctuation dropped (the answer is YAML).
clean() { head -n 1 | tr -cd 'A-Za-z0-9 ._-'; }
echo own-loopback | nc -l -p 7071 > /dev/null 2> listen.err &
sleep 1
own=$(sleep 1 | nc 127.0.0.1 7071 2> connect.err | clean)
vm=$( (sleep 1 | nc 127.0.0.1 7070 2>&1) | clean)
echo "apiVersion: v1"
echo "kind: ConfigMap"
echo "metadata: {name: loopback}"
echo "data:"
echo "  own: \"$own\""
echo "  listen: \"$(clean < listen.err)\""
echo "  connect: \"$(clean < connect.err)\""
echo "  vm: \"$vm\""
