"""flmesh.replay."""
