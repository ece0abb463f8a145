"""flmesh.transports."""
