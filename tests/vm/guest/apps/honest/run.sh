# An honest plugin: one ConfigMap naming the identity it ran as.
cat <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: honest
data:
  uid: "$(id -u)"
YAML
