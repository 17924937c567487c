"""The supervisor: lock, socket, children, and the route from clients to the writer."""
