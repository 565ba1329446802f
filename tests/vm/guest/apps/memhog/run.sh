# A memory hog: sort keeps its one 400 MB line in memory; the request's memory cgroup
# (memoryBytes 64Mi) must kill it long before.
head -c 400000000 /dev/zero | sort > /dev/null
echo "apiVersion: v1"
