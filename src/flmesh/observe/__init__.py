"""flmesh.observe."""
