"""The Kubernetes target: a fleet of servers on the user's own cluster."""
