# A deadline overrun with a daemon that ignores SIGTERM and leaves its process group: the
# client's deadline ends the request; nothing of it may be left afterwards.
setsid sh -c 'trap "" TERM HUP; exec sleep 1000' &
sleep 1000
