"""flmesh.sim."""
