"""flmesh.transports.memory."""
