"""Running Kiln past one process: Ray Serve replicas (`kiln.scale.ray_serve`, needs the `ray`
extra) and what they share without Ray: an in-process ASGI bridge and the routing key."""
