# A memory hog: sort keeps its one 400 MB line in memory; the request's memory cgroup
# (memoryBytes 64Mi) must kill it long before, or, where no cgroup is delegated, the
# container's memory limit (the OOM killer takes the command first: oom_score_adj 1000).
head -c 400000000 /dev/zero | sort > /dev/null || exit 1
echo "apiVersion: v1"
