"""flmesh.deploy."""
